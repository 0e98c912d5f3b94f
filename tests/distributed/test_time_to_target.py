"""Time to target is measured to one worker step, the same way for every algorithm."""

import json

import pytest

from hetbench.reports.load import load_evals, load_runs
from hetbench.reports.tables import time_to_target_table
from hetbench.reports.targets import parse_target
from tests.helpers import QUARTER_MINUTE_CASES, events, run_config, skip_unless_today, summary

COMMON = dict(algorithm="allreduce", workload="mlp-digits", workers=2, iterations=120,
              warmup_iterations=2, target="accuracy:0.8")


def _target_record(run_dir):
    records = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    return next(r for r in records if r["kind"] == "target")


# Times two runs against each other on 2 shared cores: a burst of outside load can skew one,
# so it runs again, up to twice, with the same assertion (pytest-rerunfailures).
@pytest.mark.slow
@pytest.mark.flaky(reruns=2, reruns_delay=2)
def test_twice_the_pacing_takes_twice_as_long_to_the_target(tmp_path):
    skip_unless_today("twice-the-pacing", QUARTER_MINUTE_CASES, per_day=2)
    # Same seed, same model trajectory; only each iteration's compute floor differs (the
    # harness's own per-iteration cost is small beside 40 ms). Read off evaluations 1 s apart
    # the two times came out equal (ratio 1.00) in the runs that motivated this.
    for pace_ms in (40, 80):
        done = run_config(tmp_path / f"p{pace_ms}", pace_ms=pace_ms, **COMMON)
        assert done["status"] == "ok", done["cause"]
    fast, slow = _target_record(tmp_path / "p40"), _target_record(tmp_path / "p80")
    # The same step met it (give or take the other worker's step ending just before or after).
    assert abs(fast["iteration"] - slow["iteration"]) <= 1
    assert fast["resolution_iterations"] == slow["resolution_iterations"] == 1
    assert fast["exact"] and slow["exact"]  # every step end from the start was tested
    # The time is when a step ended and the averaged model met the target: never the tick of
    # the evaluation that bracketed it (a snapshot evaluated at its tick holds the models of
    # that very moment, so a crossing up to one step after the tick is not reported early).
    assert fast["moment"] == slow["moment"] == "step end"
    assert slow["wall_s"] / fast["wall_s"] == pytest.approx(2.0, rel=0.10)
    # The report uses the refined time, not the evaluation grid.
    runs = load_runs(tmp_path)
    table = time_to_target_table(runs, load_evals(runs), {"mlp-digits": parse_target(
        "accuracy:0.8")})
    assert list(table["resolution"]) == ["1 step (refined)"]  # both runs are one cell
    assert table["time_to_target_s"].iloc[0] == pytest.approx(
        (fast["wall_s"] + slow["wall_s"]) / 2)
    # Consistency: the refined moment lies between the run's start and its end.
    assert 0 < fast["wall_s"] < summary(tmp_path / "p40")["train_wall_s"] + 1


# The models at each evaluation tick are the ones the workers had at that moment; under
# outside load a tick can fall between the two workers' ends of one step (their models then
# differ by that step), so it runs again, up to twice, with the same assertion.
@pytest.mark.slow
@pytest.mark.flaky(reruns=2, reruns_delay=2)
def test_a_batch_norm_model_is_scored_with_the_workers_averaged_statistics(tmp_path):
    # VGG-16's CIFAR form (batch norm) on the digits. Evaluation averages each worker's running
    # statistics with its parameters, at each snapshot's own moment; consensus counts the
    # parameters only, so All-Reduce's workers agree exactly though their statistics differ.
    done = run_config(tmp_path, algorithm="allreduce", workload="vgg16", workers=2,
                      iterations=60, warmup_iterations=2, eval_interval_s=0.5,
                      target="loss:1.0", workload_options={
                          "dataset": "digits", "variant": "cifar-bn", "width": 0.125,
                          "lr": 0.02, "momentum": 0.9})
    assert done["status"] == "ok", done["cause"]
    assert done["data"] == "scikit-learn digits, upscaled to 32x32x3"
    records = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert all(r["consensus_distance"] == 0 for r in records)
    snapshots = [r for r in records if r["kind"] == "snapshot"]
    assert snapshots[0]["test_loss"] > 2.0 > 1.0 > done["final_test_loss"]  # chance is 2.30
    target = _target_record(tmp_path)
    assert target["test_loss"] <= 1.0 and target["moment"] == "step end"


def test_every_rank_times_the_run_from_one_common_start(tmp_path):
    """Times from t0 (evaluation ticks, the target search's step ends) put every worker's model
    on one timeline: every rank's t0 is the same, so the moment the search reports is one
    moment of the real run, at which each worker had ended the steps its absolute event times
    say. (Each rank's own clock after the barrier started up to ~80 ms apart on 2 cores.)"""
    done = run_config(tmp_path, algorithm="ps-async", workload="mlp-digits", workers=4,
                      iterations=60, warmup_iterations=2, pace_ms=10, seed=1,
                      target="accuracy:0.8")
    assert done["status"] == "ok", done["cause"]
    starts = {json.loads((tmp_path / f"done.rank{r}.json").read_text())["start_ns"]
              for r in range(5)}  # the server's too
    assert len(starts) == 1
    moment_ns = starts.pop() + _target_record(tmp_path)["wall_s"] * 1e9
    logs = events(tmp_path, 4)
    ended = [sum(e["t_end"] <= moment_ns + 1_000 for e in logs[r]) for r in range(4)]
    assert _target_record(tmp_path)["iteration"] == pytest.approx(sum(ended) / 4)


def test_reading_the_data_is_set_up_not_time_to_target(tmp_path):
    """A workload that builds its data at the first draw (mlp-clusters generates it: 200,000
    samples here, seconds a rank) does so before the common start: the first step starts at
    t0, so the data's time is in nobody's time to target (issue 46's held-out check found
    6-13 s of it in every real run at 8-16 ranks, and none in the simulated runs)."""
    done = run_config(tmp_path, algorithm="allreduce", workload="mlp-clusters", workers=2,
                      iterations=20, warmup_iterations=2,
                      workload_options={"samples": 200_000, "test_samples": 512})
    assert done["status"] == "ok", done["cause"]
    for rank, lines in events(tmp_path, 2).items():
        t0_ns = json.loads((tmp_path / f"done.rank{rank}.json").read_text())["start_ns"]
        assert (lines[0]["t_start"] - t0_ns) / 1e9 < 0.5, f"rank {rank} read its data after t0"
