"""All-Reduce's three implementations (buckets, torch DDP, Horovod) on real gloo ranks agree.

Same seed, same data, same synchronous SGD: every worker of every implementation must end with
the same parameters, up to the order in which floats were summed.
"""

import os
import subprocess

import numpy as np
import pytest
import torch

from hetbench.algorithms.allreduce import horovod_missing
from hetbench.core.config import RunConfig
from hetbench.core.tensors import flat_params
from tests.helpers import final_models, run_config

ITERATIONS = 10


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


_made: dict[tuple, np.ndarray] = {}


def run_impl(runs_dir, impl, workers, workload="mlp-digits", **workload_options):
    """Final parameters of every worker of one run (asserting they agree with each other).

    Each distinct run is made once per module: tests that compare against the same reference
    (buckets, 3 workers, emulated compute) share it."""
    key = (impl, workers, workload, tuple(sorted(workload_options.items())))
    if key not in _made:
        _made[key] = _run_impl(runs_dir / f"{impl}-{workload}-{workers}-{len(_made)}", impl,
                               workers, workload, workload_options)
    return _made[key]


def _run_impl(run_dir, impl, workers, workload, workload_options):
    summary = run_config(run_dir, algorithm="allreduce", workload=workload, workers=workers,
                         iterations=ITERATIONS, warmup_iterations=2, save_models=True, seed=5,
                         algorithm_options={"impl": impl},
                         workload_options={"lr": 0.2, "momentum": 0.9, **workload_options})
    assert summary["status"] == "ok", f"{impl}: {summary['cause']}"
    assert summary["iterations_per_worker"] == [ITERATIONS] * workers
    models = final_models(run_dir, workers)
    for rank, params in enumerate(models[1:], start=1):
        np.testing.assert_allclose(params, models[0], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{impl}: worker {rank} differs from worker 0")
    return models[0]


def initial_params(workload):
    config = RunConfig(algorithm="allreduce", workload=workload, workers=2, iterations=1,
                       warmup_iterations=0, seed=5)
    model_of = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)  # as every worker does before building its model
    return flat_params(model_of.build_model()).numpy()


def assert_same(a, b, what):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=what)


def require_horovod():
    why = horovod_missing()
    if why is None:
        return
    if os.environ.get("CI") in ("true", "1"):
        pytest.fail(f"CI builds horovod (make horovod) but horovod.torch does not import: {why}")
    pytest.skip(f"horovod is not installed (run `make horovod`): {why}")


@pytest.mark.parametrize("workload", ["mlp-digits", "svm"])
def test_ddp_matches_buckets(runs_dir, workload):
    # svm's loss reads model.weight, which the DDP wrapper must pass through.
    ddp = run_impl(runs_dir, "ddp", 3, workload)
    assert not np.allclose(ddp, initial_params(workload)), "training must move the model"
    assert_same(ddp, run_impl(runs_dir, "buckets", 3, workload), f"ddp vs buckets on {workload}")


@pytest.mark.parametrize("workers", [2, 4])
def test_horovod_matches_ddp_and_buckets(runs_dir, workers):
    require_horovod()
    horovod = run_impl(runs_dir, "horovod", workers)
    assert not np.allclose(horovod, initial_params("mlp-digits")), "training must move the model"
    assert_same(horovod, run_impl(runs_dir, "ddp", workers), f"horovod vs ddp, {workers} workers")
    assert_same(horovod, run_impl(runs_dir, "buckets", workers),
                f"horovod vs buckets, {workers} workers")


@pytest.mark.parametrize("impl", ["ddp", "horovod"])
def test_emulated_compute_is_averaged_too(runs_dir, impl):
    # No forward/backward under emulated compute: DDP's hooks never fire (the algorithm then
    # averages itself) and Horovod's synchronize() reduces the gradients no hook saw.
    if impl == "horovod":
        require_horovod()
    emulated = {"compute": "emulated", "compute_ms": 1.0}
    got = run_impl(runs_dir, impl, 3, **emulated)
    assert not np.allclose(got, initial_params("mlp-digits")), "training must move the model"
    assert_same(got, run_impl(runs_dir, "buckets", 3, **emulated), f"{impl} vs buckets, emulated")


def test_missing_horovod_is_one_error_line_before_any_process_starts(tmp_path, bench_cmd,
                                                                      cli_env):
    if horovod_missing() is None:
        pytest.skip("horovod is installed here; the error is for machines without it")
    matrix = tmp_path / "m.toml"
    matrix.write_text('algorithms = ["allreduce"]\nworkloads = ["mlp-digits"]\nworkers = [2]\n'
                      'iterations = 10\n[algorithm.allreduce]\nimpl = "horovod"\n')
    out = tmp_path / "out"
    result = subprocess.run([*bench_cmd, "run", str(matrix), "--out", str(out)],
                            capture_output=True, text=True, env=cli_env, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "make horovod" in lines[0], lines
    assert not out.exists(), "nothing may run (or be written) before the error"
