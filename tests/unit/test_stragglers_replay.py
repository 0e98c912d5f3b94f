"""replay:PATH: a compute table's factors, wrap-around, and what All-Reduce feels (simulated)."""

from __future__ import annotations

import numpy as np
import pytest

from hetbench.core.config import RunConfig
from hetbench.errors import UserError
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import simulate
from hetbench.slowdown import parse_slowdown
from hetbench.slowdown.table import SHIPPED_DIR, read_table, shipped_tables, table_csv

# A fast network: All-Reduce's step is its slowest worker's compute, nearly to the percent.
MODELS = SimModels(NetworkModel(alpha_s=1e-6, beta_bytes_per_s=1e11), ComputeModel())


def write(tmp_path, compute_s: np.ndarray, name="t.csv") -> str:
    path = tmp_path / name
    path.write_text(table_csv(np.asarray(compute_s, dtype=float)))
    return str(path)


def allreduce_throughput(tmp_path, slowdown: str, workers: int, iterations=80) -> float:
    config = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=workers,
                       slowdown=slowdown, iterations=iterations, pace_ms=20)
    summary = simulate(config, MODELS, tmp_path / config.run_id).summary
    assert summary["status"] == "ok"
    return summary["throughput"]


def test_factor_is_compute_over_the_iterations_median_and_at_least_one(tmp_path):
    compute = [[1.0, 2.0, 3.0],
               [2.0, 2.0, 1.0],
               [4.0, 1.0, 2.0]]  # medians per iteration: 2, 2, 2
    injector = parse_slowdown(f"replay:{write(tmp_path, compute)}")
    injector.validate(3)
    got = [[injector.factor(w, k, 0.0) for k in range(3)] for w in range(3)]
    assert got == [[1.0, 1.0, 1.5], [1.0, 1.0, 1.0], [2.0, 1.0, 1.0]]
    assert injector.time_free


def test_workers_and_iterations_wrap_around_the_table(tmp_path):
    compute = np.array([[1.0, 1.0, 1.0], [3.0, 1.0, 5.0]])  # 2 workers x 3 iterations
    injector = parse_slowdown(f"replay:{write(tmp_path, compute)}")
    injector.validate(5)
    factors = compute / np.median(compute, axis=0)
    factors = np.maximum(1.0, factors)
    for k in range(8):
        want = [factors[w % 2, k % 3] for w in range(5)]
        assert injector.factors(k, np.zeros(5)).tolist() == want
        assert [injector.factor(w, k, 12.5) for w in range(5)] == want
    assert injector.factor(3, 5, 0.0) == factors[1, 2] == pytest.approx(5 / 3)


def test_a_worker_twice_as_slow_every_iteration_halves_allreduce(tmp_path):
    compute = np.ones((4, 10))
    compute[2] = 2.0
    spec = f"replay:{write(tmp_path, compute)}"
    slowdown = (allreduce_throughput(tmp_path, "none", 4)
                / allreduce_throughput(tmp_path, spec, 4))
    assert slowdown == pytest.approx(2.0, rel=0.05)


def test_jitter_slows_allreduce_by_the_mean_per_iteration_maximum(tmp_path):
    rng = np.random.default_rng(7)
    compute = rng.lognormal(0.0, 0.15, size=(8, 37))
    table_factors = np.maximum(1.0, compute / np.median(compute, axis=0))
    spec = f"replay:{write(tmp_path, compute)}"
    iterations = 37 * 3 + 5  # a whole number of table passes after the warm-up
    slowdown = (allreduce_throughput(tmp_path, "none", 8, iterations)
                / allreduce_throughput(tmp_path, spec, 8, iterations))
    expected = table_factors.max(axis=0).mean()
    assert expected > 1.1  # the check means something
    assert slowdown == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize("name", ["bytedance-st", "bytedance-se", "bytedance-ar"])
def test_shipped_traces_slow_allreduce_by_their_own_arithmetic(tmp_path, name):
    assert name in shipped_tables()
    table = read_table(SHIPPED_DIR / f"{name}.csv")
    iterations = table.iterations * 2 + 5
    expected = table.factors().max(axis=0).mean()
    slowdown = (allreduce_throughput(tmp_path, "none", table.workers, iterations)
                / allreduce_throughput(tmp_path, f"replay:{name}", table.workers, iterations))
    assert slowdown == pytest.approx(expected, rel=0.05)


def test_same_table_replays_identically_whatever_the_seed(tmp_path):
    spec = "replay:bytedance-se"
    a, b = parse_slowdown(spec, seed=1), parse_slowdown(spec, seed=99)
    a.validate(40)
    b.validate(40)
    for k in (0, 1, 42, 43, 500):
        assert a.factors(k, np.zeros(40)).tolist() == b.factors(k, np.zeros(40)).tolist()


@pytest.mark.parametrize("text, fragment", [
    ("worker,iteration\n0,0\n", ":1: the header must be worker,iteration,compute_s"),
    ("worker,iteration,compute_s\n0,0,1.0\n0,1,0\n", ":3: compute_s must be a positive"),
    ("worker,iteration,compute_s\n0,0,1.0\n0,1,-2\n", ":3: compute_s must be a positive"),
    ("worker,iteration,compute_s\n0,0,1.0\n0,0,2.0\n", ":3: duplicate row for worker 0"),
    ("worker,iteration,compute_s\n0,0,x\n", ":2: expected worker,iteration,compute_s"),
    ("worker,iteration,compute_s\n0,0,1\n1,1,1\n", "2 of 2 workers x 2 iterations missing"),
    ("", "empty; the header must be"),
])
def test_bad_tables_name_the_file_and_line(tmp_path, text, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        parse_slowdown(f"replay:{path}")
    assert str(path) in str(err.value) and fragment in str(err.value)


def test_parquet_tables_read_alike_and_name_missing_columns(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    compute = np.array([[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]])
    rows = [(w, k, compute[w, k]) for w in range(3) for k in range(2)]
    good = tmp_path / "t.parquet"
    pd.DataFrame(rows, columns=["worker", "iteration", "compute_s"]).to_parquet(good)
    assert np.array_equal(read_table(good).compute_s, compute)
    bad = tmp_path / "bad.parquet"
    pd.DataFrame(rows, columns=["worker", "step", "compute_s"]).to_parquet(bad)
    with pytest.raises(UserError, match=r"missing column.*iteration"):
        parse_slowdown(f"replay:{bad}")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(UserError, match="cannot read it as parquet"):
        parse_slowdown(f"replay:{garbage}")


def test_a_path_spec_gives_a_valid_run_directory_name(tmp_path):
    spec = f"replay:{write(tmp_path, np.ones((2, 3)))}"
    config = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=2,
                       slowdown=spec, iterations=20)
    assert "/" not in config.run_id and config.run_id.startswith("allreduce-mlp-digits-w2-replay_")
    (tmp_path / config.run_id).mkdir()
