"""Unreadable files are reported, not fatal (issue 34): `bench report`, `compare` and `export`
over a results directory where one run's summary.json is cut short, another's config.json is
garbage and a third's event log holds a garbage line."""

import csv
import json
import shutil
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results"
TRUNCATED_SUMMARY = "ps-async-mlp-digits-w2-prob_3-s2-19599c5cff"
GARBAGE_CONFIG = "allreduce-mlp-digits-w2-det_200_1-s1-6587416095"
GARBAGE_EVENT_LINE = "ps-async-mlp-digits-w2-none-s1-d653ae35cc"


@pytest.fixture
def damaged(tmp_path):
    out = tmp_path / "results"
    shutil.copytree(FIXTURE, out)
    summary = out / TRUNCATED_SUMMARY / "summary.json"
    summary.write_text(summary.read_text()[:100])  # as a full disk or a partial copy leaves it
    (out / GARBAGE_CONFIG / "config.json").write_bytes(b"\x00\xff not json")
    with (out / GARBAGE_EVENT_LINE / "events.rank0.jsonl").open("ab") as f:
        f.write(b"\xde\xad garbage line\n")
    return out


def warnings_of(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("warning: ")]


@pytest.mark.slow
def test_report_writes_the_rest_and_names_each_bad_run(damaged, bench):
    result = bench("report", damaged)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    warnings = warnings_of(result)
    assert len(warnings) == 3, result.stderr
    assert any(TRUNCATED_SUMMARY in w and "summary.json does not parse" in w for w in warnings)
    assert any(GARBAGE_CONFIG in w and "config.json does not parse" in w for w in warnings)
    assert any(GARBAGE_EVENT_LINE in w and "1 unreadable line(s)" in w for w in warnings)

    with (damaged / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    cells = {(r["algorithm"], r["slowdown"]): r for r in rows}
    # Every readable run is in: ps-async prob:3 keeps its seed 1 (seed 2 was the truncated one);
    # the run with the garbage event line is read with the line skipped.
    assert set(cells) == {("allreduce", "none"), ("allreduce", "prob:3"),
                          ("ps-async", "none"), ("ps-async", "prob:3")}
    assert cells[("ps-async", "prob:3")]["seeds"] == "1"
    assert float(cells[("ps-async", "none")]["throughput"]) > 0
    report = (damaged / "report.md").read_text()
    assert "Left out, unreadable (2 run(s))" in report
    assert TRUNCATED_SUMMARY in report and GARBAGE_CONFIG in report
    assert f"Unreadable event lines skipped: {GARBAGE_EVENT_LINE}: 1" in report


@pytest.mark.slow
def test_compare_and_export_skip_the_bad_runs(damaged, bench, tmp_path):
    compare = bench("compare", damaged, "--baseline", "allreduce")
    assert compare.returncode == 0, compare.stderr
    assert len(warnings_of(compare)) == 2  # compare reads no event logs
    assert "ps-async" in compare.stdout

    trace = bench("export", "trace", damaged, "--out", tmp_path / "traces")
    assert trace.returncode == 0, trace.stderr
    assert len(warnings_of(trace)) == 3
    written = {p.stem for p in (tmp_path / "traces").glob("*.json")}
    assert TRUNCATED_SUMMARY not in written and GARBAGE_CONFIG not in written
    assert GARBAGE_EVENT_LINE in written and len(written) == 5
    for path in (tmp_path / "traces").glob("*.json"):
        json.loads(path.read_text())


def test_a_directory_of_only_unreadable_runs_is_one_line(tmp_path, bench):
    run = tmp_path / "results" / "one-run"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{")
    result = bench("report", tmp_path / "results")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith("error: no readable finished runs")
    assert "Traceback" not in result.stderr
