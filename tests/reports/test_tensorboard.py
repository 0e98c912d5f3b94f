"""`bench export tensorboard`: TensorBoard's own reader gets back what the runs logged."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from hetbench.core.store import read_jsonl
from hetbench.reports.load import select_run_dirs
from hetbench.reports.tensorboard import export_tensorboard

from .conftest import RESULTS

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard not installed (pip install -e '.[dev]')")

RUN = "allreduce-mlp-digits-w2-prob_3-s1-0faad71447"


def read_back(run_log_dir):
    """Everything TensorBoard's reader finds in one run's directory (no sampling)."""
    accumulator = event_accumulator.EventAccumulator(
        str(run_log_dir), size_guidance={event_accumulator.SCALARS: 0,
                                         event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return accumulator


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("tb") / "logs"
    dirs = export_tensorboard(select_run_dirs(RESULTS), out)
    return out, dirs


def test_one_directory_per_run_named_by_its_id(exported):
    out, dirs = exported
    assert sorted(d.name for d in dirs) == sorted(d.name for d in select_run_dirs(RESULTS))
    assert all(d.parent == out and len(list(d.glob("events.out.tfevents.*"))) == 1
               for d in dirs)


def test_reader_gets_back_the_evaluations_and_training_losses(exported):
    out, _ = exported
    run = RESULTS / RUN
    acc = read_back(out / RUN)
    evals = [r for r in read_jsonl(run / "eval.jsonl")[0] if "test_accuracy" in r]
    evals.sort(key=lambda r: r["wall_s"])
    accuracy = acc.Scalars("test/accuracy")
    assert [s.value for s in accuracy] == pytest.approx([r["test_accuracy"] for r in evals])
    assert [s.step for s in accuracy] == [round(r["iteration"]) for r in evals]
    assert [s.value for s in acc.Scalars("test/loss")] == pytest.approx(
        [r["test_loss"] for r in evals], rel=1e-6)
    # Wall time: evaluation seconds after the run's first step, on the events' Unix clock.
    first = min(json.loads(line)["t_start"] for rank in (0, 1)
                for line in (run / f"events.rank{rank}.jsonl").read_text().splitlines())
    assert accuracy[-1].wall_time - first / 1e9 == pytest.approx(evals[-1]["wall_s"], abs=1e-3)

    losses = defaultdict(list)
    for rank in (0, 1):
        for e in read_jsonl(run / f"events.rank{rank}.jsonl")[0]:
            losses[e["iteration"]].append(e["loss"])
    train = acc.Scalars("train/loss")
    assert [s.step for s in train] == sorted(losses)
    assert [s.value for s in train] == pytest.approx(
        [sum(v) / len(v) for _, v in sorted(losses.items())], rel=1e-6)


def test_throughput_shares_config_and_hparams(exported):
    out, _ = exported
    run = RESULTS / RUN
    acc = read_back(out / RUN)
    summary = json.loads((run / "summary.json").read_text())
    (steady,) = acc.Scalars("throughput/steady_state")
    assert steady.value == pytest.approx(summary["throughput"], rel=1e-6)
    binned = acc.Scalars("throughput/samples_per_s")
    assert binned and all(s.value >= 0 for s in binned)
    # Every sample of the run is in exactly one bin.
    width = (binned[1].wall_time - binned[0].wall_time)
    assert sum(s.value for s in binned) * width == pytest.approx(summary["samples"], rel=1e-3)
    for rank in (0, 1):
        shares = [acc.Scalars(f"{phase}_share/worker_{rank}")
                  for phase in ("compute", "slowdown", "wait", "comm")]
        for points in zip(*shares, strict=True):
            assert sum(p.value for p in points) == pytest.approx(1.0, rel=1e-5)
    config = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads(config)["slowdown"] == "prob:3"
    assert set(acc.PluginTagToContent("hparams")) == {
        "_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"}
    (accuracy,) = acc.Scalars("hparam/final_test_accuracy")
    assert accuracy.value == pytest.approx(summary["final_test_accuracy"])


def test_a_second_export_replaces_the_first(exported):
    out, _ = exported
    before = len(read_back(out / RUN).Scalars("train/loss"))
    export_tensorboard(select_run_dirs(RESULTS, (RUN,)), out)
    assert len(list((out / RUN).glob("events.out.tfevents.*"))) == 1
    assert len(read_back(out / RUN).Scalars("train/loss")) == before


@pytest.mark.slow
def test_cli_exports_and_rejects_an_unknown_run(tmp_path, bench):
    out = tmp_path / "tb"
    unique_prefix = RUN[:-11]
    result = bench("export", "tensorboard", RESULTS, "--out", out, "--run", unique_prefix)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in out.iterdir()] == [RUN]
    bad = bench("export", "tensorboard", RESULTS, "--out", out, "--run", "nope")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        f"error: --run 'nope' matches 0 runs under {RESULTS}; give one run id (a directory "
        "name there)"]
