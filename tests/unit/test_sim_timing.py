"""[timing] (issue 46): a learned simulation plays another workload's costs (its message sizes,
compute and samples) over its own workload's math, and says which is which."""

import json

import numpy as np
import pytest

from hetbench.core.config import RunConfig
from hetbench.errors import UserError
from hetbench.sim.layout import layout
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import simulate
from tests.helpers import SLOW_VARIANT_CASES, final_models, skip_unless_today

MODELS = SimModels(NetworkModel(alpha_s=20e-6, beta_bytes_per_s=1.25e9), ComputeModel())
RESNET50_H200 = {"workload": "resnet50", "batch_size": 64, "compute": "emulated",
                 "compute_preset": "h200"}
#: A small mlp-clusters, so the learning is quick.
CLUSTERS = {"samples": 4096, "test_samples": 512, "batch_size": 16, "momentum": 0.9}


def _config(**fields) -> RunConfig:
    base = dict(algorithm="allreduce", workload="mlp-clusters", workers=8, iterations=30,
                warmup_iterations=2, seed=3, save_models=True, learn=True,
                workload_options=CLUSTERS, eval_interval_s=0.05)
    return RunConfig(**{**base, **fields})


def test_timing_moves_the_clock_and_never_the_math(tmp_path):
    own = simulate(_config(pace_ms=5), MODELS, tmp_path / "own")
    timed = simulate(_config(pace_ms=5, timing=RESNET50_H200), MODELS, tmp_path / "timed")
    # The same models, bit for bit: the timing workload's costs never reach the learning.
    for a, b in zip(final_models(own.run_dir, 8), final_models(timed.run_dir, 8), strict=True):
        np.testing.assert_array_equal(a, b)
    assert timed.summary["final_test_accuracy"] == own.summary["final_test_accuracy"]
    # Each iteration costs ResNet-50's: the preset's 32.55 ms of compute, then a ring
    # all-reduce of each of its buckets (94 MB in all) over 8 workers.
    buckets = layout(_config(pace_ms=5, timing=RESNET50_H200).timing_config).bucket_bytes
    assert sum(buckets) == timed.summary["timing"]["model_bytes"] > 90e6
    iteration_s = 0.03255 + sum(MODELS.network.ring_allreduce(b, 8) for b in buckets)
    assert timed.summary["train_wall_s"] == pytest.approx(30 * iteration_s, rel=1e-6)
    assert own.summary["train_wall_s"] < timed.summary["train_wall_s"] / 10
    # Samples are ResNet-50's batch of 64 (throughput is that job's), not the proxy's 16.
    assert timed.summary["samples"] == 4 * own.summary["samples"]
    assert timed.summary["timing"]["workload"] == "resnet50"
    assert "not a resnet50's accuracy" in timed.summary["timing"]["meaning"]
    assert timed.summary["sim"]["timing_workload"] == "resnet50"
    # Evaluations are at the simulated seconds the timing gives, of the same models.
    own_evals = _snapshots(own.run_dir)
    timed_evals = _snapshots(timed.run_dir)
    assert max(e["wall_s"] for e in timed_evals) > 10 * max(e["wall_s"] for e in own_evals)


def _snapshots(run_dir) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "eval.jsonl").open()]
    return [r for r in records if r["kind"] == "snapshot"]


def test_the_run_id_and_the_label_name_the_timing():
    own, timed = _config(pace_ms=5), _config(pace_ms=5, timing=RESNET50_H200)
    assert own.run_id != timed.run_id
    assert "(timing of resnet50)" in timed.label() and "timing" not in own.label()
    # The timing workload's options are resolved: the preset's compute is on record.
    assert timed.timing["compute_ms"] == 32.55
    assert RunConfig.from_dict(timed.to_dict()).run_id == timed.run_id


@pytest.mark.parametrize("fields, message", [
    ({"learn": False, "timing": RESNET50_H200}, "without learning, simulate resnet50 itself"),
    ({"timing": {"batch_size": 64}}, "[timing] needs `workload"),
    ({"timing": {"workload": "nosuch"}}, "nosuch"),
    ({"timing": {**RESNET50_H200, "batch_size": 48}}, "no figure for resnet50 at batch_size 48"),
    ({"timing": {**RESNET50_H200, "colour": 1}}, "colour"),
])
def test_a_bad_timing_table_is_one_clear_error(fields, message):
    with pytest.raises(UserError) as caught:
        _config(pace_ms=5, **fields)
    assert message in str(caught.value)


@pytest.mark.slow
def test_bench_sim_takes_timing_from_a_matrix_and_the_report_says_whose_numbers_are_whose(
        tmp_path, bench):
    skip_unless_today("sim-timing-from-a-matrix", SLOW_VARIANT_CASES, per_day=4)
    matrix = tmp_path / "m.toml"
    matrix.write_text(
        'algorithms = ["allreduce", "dpsgd"]\nworkloads = ["mlp-clusters"]\nworkers = [8]\n'
        'iterations = 20\nlearn = true\n[workload.mlp-clusters]\nsamples = 4096\n'
        'test_samples = 512\nbatch_size = 16\n[network]\npreset = "prague"\n'
        '[timing]\nworkload = "resnet50"\nbatch_size = 64\ncompute = "emulated"\n'
        'compute_preset = "h200"\n')
    out = tmp_path / "out"
    ran = bench("sim", matrix, "--out", out)
    assert ran.returncode == 0, ran.stderr
    assert "(timing of resnet50)" in ran.stdout
    assert bench("report", out).returncode == 0
    md = (out / "report.md").read_text()
    assert ("Timing of another workload: the learned simulations of mlp-clusters played "
            "resnet50's costs (batch 64, compute 32.55 ms from compute_preset h200") in md
    assert "not a resnet50's." in md
    # Without learning the table is refused in one line, exit 2.
    matrix.write_text(matrix.read_text().replace("learn = true\n", ""))
    refused = bench("sim", matrix, "--out", tmp_path / "out2")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: [timing] gives a learned simulation (bench sim --learn) another workload's "
        "costs; without learning, simulate resnet50 itself (put it in `workloads`)"]
