"""`bench trace import` and replay:PATH through the real CLI: tables, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetbench.core.config import RunConfig
from hetbench.core.store import read_jsonl
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import simulate
from hetbench.slowdown.table import SHIPPED_DIR, read_table

ST_SOURCE = SHIPPED_DIR / "source" / "trace-ST.parquet"


def one_error_line(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_st_trace_imports_to_the_shipped_and_documented_table(bench, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    out = tmp_path / "st.csv"
    result = bench("trace", "import", ST_SOURCE, "--out", out)
    assert result.returncode == 0, result.stderr
    assert "2 workers x 32 iterations" in result.stdout
    table = read_table(out)
    assert np.array_equal(table.compute_s, read_table(SHIPPED_DIR / "bytedance-st.csv").compute_s)
    # The documented rule, computed here from the raw operations of one cell: data-parallel
    # rank 1 at the first traced step is its slowest stage's forward + backward compute.
    trace = pd.read_parquet(ST_SOURCE)
    first_step = trace["step"].min()
    ops = trace[(trace["dp_rank"] == 1) & (trace["step"] == first_step)
                & trace["optype"].astype(str).isin(["forward-compute", "backward-compute"])]
    want = ops.groupby("stage")["duration"].sum().max()
    assert table.compute_s[1, 0] == pytest.approx(want, rel=1e-5)
    # ST's stragglers are a slow pipeline stage that every replica carries: data-parallel
    # ranks stay within a percent of each other (docs/stragglers.md: 1.004x on average).
    assert table.factors().max(axis=0).mean() == pytest.approx(1.0035, abs=0.001)


def test_parquet_out_reads_back_as_the_same_table(bench, tmp_path):
    pytest.importorskip("pyarrow")
    out = tmp_path / "st.parquet"
    assert bench("trace", "import", ST_SOURCE, "--out", out).returncode == 0
    # CSV keeps 6 significant digits, parquet the trace's float32 durations summed.
    assert np.allclose(read_table(out).compute_s,
                       read_table(SHIPPED_DIR / "bytedance-st.csv").compute_s, rtol=1e-5)


def test_a_run_directory_imports_each_workers_measured_compute(bench, tmp_path):
    config = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=3,
                       slowdown="none", iterations=12, pace_ms=15)
    models = SimModels(NetworkModel(alpha_s=1e-4, beta_bytes_per_s=1e9), ComputeModel())
    run_dir = simulate(config, models, tmp_path / "runs" / config.run_id).run_dir
    out = tmp_path / "measured.csv"
    result = bench("trace", "import", run_dir, "--out", out)
    assert result.returncode == 0, result.stderr
    table = read_table(out)
    assert (table.workers, table.iterations) == (3, 12)
    for rank in range(3):
        events, _ = read_jsonl(run_dir / f"events.rank{rank}.jsonl")
        want = [e["compute_s"] for e in sorted(events, key=lambda e: e["iteration"])]
        assert table.compute_s[rank] == pytest.approx(want, rel=1e-5)


def test_a_failed_import_leaves_the_existing_table_and_directory_untouched(bench, tmp_path):
    out = tmp_path / "results" / "table.csv"
    out.parent.mkdir()
    out.write_text("worker,iteration,compute_s\n0,0,1\n1,0,2\n")
    (tmp_path / "results" / "summary.json").write_text(json.dumps({"status": "ok"}))
    before = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 but not really")
    line = one_error_line(bench("trace", "import", bad, "--out", out))
    assert str(bad) in line
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "not-a-run", "wrong-columns"])
def test_bad_import_sources_get_one_line(bench, tmp_path, case):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    src = tmp_path / "src.parquet"
    if case == "not-a-run":
        src = tmp_path / "empty-dir"
        src.mkdir()
    elif case == "wrong-columns":
        pd.DataFrame({"dp_rank": [0], "step": [1], "duration": [1.0]}).to_parquet(src)
    line = one_error_line(bench("trace", "import", src, "--out", tmp_path / "t.csv"))
    assert str(src) in line
    assert not (tmp_path / "t.csv").exists()


@pytest.mark.slow
@pytest.mark.parametrize("text, fragment", [
    (None, "does not exist"),
    ("worker,iteration\n0,0\n", "bad.csv:1: the header must be"),
    ("worker,iteration,compute_s\n0,0,1\n1,0,0\n", "bad.csv:3: compute_s must be a positive"),
    ("worker,iteration,compute_s\n0,0,1\n0,0,1\n", "bad.csv:3: duplicate row"),
    (b"\xff\xfe\x00garbage", "cannot read it"),
])
def test_bad_replay_tables_exit_2_with_one_line(bench, tmp_path, text, fragment):
    path = tmp_path / "bad.csv"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    line = one_error_line(bench("run", "--algorithms", "allreduce", "--workloads", "mlp-digits",
                                "--workers", "2", "--iterations", "20", "--slowdown",
                                f"replay:{path}", "--out", tmp_path / "out", "--dry-run"))
    assert fragment in line and str(path) in line


@pytest.mark.slow
@pytest.mark.parametrize("spec, fragment", [
    ("preset:nope", "unknown preset 'nope'"),
    ("compose:jitter(sigma=9)", "sigma must be a number in [0, 3]"),
    ("compose:failslow(on=0)", "on must be a number in [1, 1e+09]"),
])
def test_bad_presets_and_blocks_exit_2_with_one_line(bench, tmp_path, spec, fragment):
    line = one_error_line(bench("run", "--algorithms", "allreduce", "--workloads", "mlp-digits",
                                "--workers", "2", "--iterations", "20", "--slowdown", spec,
                                "--out", tmp_path / "out", "--dry-run"))
    assert fragment in line


def test_compositions_in_a_matrix_file_and_on_the_command_line(bench, tmp_path):
    matrix = tmp_path / "m.toml"
    matrix.write_text('name = "c"\nalgorithms = ["allreduce"]\nworkloads = ["mlp-digits"]\n'
                      'workers = [4]\niterations = 20\n'
                      'slowdown = ["compose:persistent(frac=0.25,k=2)+jitter(sigma=0.1)"]\n')
    result = bench("run", matrix, "--out", tmp_path / "out", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "compose:persistent(frac=0.25,k=2)+jitter(sigma=0.1)" in result.stdout
    result = bench("run", "--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers",
                   "4", "--iterations", "20", "--slowdown",
                   "none,compose:persistent(frac=0.25;k=2)", "--out", tmp_path / "o2",
                   "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "compose:persistent(frac=0.25;k=2)" in result.stdout
