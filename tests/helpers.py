"""Shared test helpers: run real configs through the real launcher, or a function on N real
gloo ranks, and read what they wrote."""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hetbench.core.config import RunConfig
from hetbench.core.store import read_jsonl
from hetbench.harness.launch.local import LocalLauncher


def rotation_day() -> int:
    """The day of the year (HETBENCH_TEST_DAY overrides it). Suites too long to run whole in
    CI (random stress cases, fault x algorithm, signal x launcher) run today's share of their
    cases, chosen by it: successive days cover all of them, and a failure is replayed by
    setting HETBENCH_TEST_DAY to the failing day's (the test ids name the cases too)."""
    return int(os.environ.get("HETBENCH_TEST_DAY") or datetime.date.today().timetuple().tm_yday)


#: The mark of a test that makes a test bed (network namespaces: root and a kernel with them).
NEEDS_TEST_BED = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/proc/self/ns/net").exists(),
    reason="the test bed makes network namespaces: needs root and a kernel with them")

#: The quick matrix's algorithms (matrices/quick.toml), which the multi-host suites run, and
#: those whose final models are a function of the seed alone (lockstep, no arrival order).
QUICK_ALGORITHMS = ["allreduce", "ps-sync", "ps-async", "dpsgd", "adpsgd", "hop",
                    "prague-static", "prague-smart"]
LOCKSTEP = {"allreduce", "ps-sync", "dpsgd", "prague-static"}
#: The multi-host suites' matrix: the quick matrix's options, short, final models kept.
ACROSS_HOSTS_MATRIX = """
workloads = ["mlp-digits"]
workers = [4]
iterations = 8
warmup_iterations = 2
seeds = [3]
save_models = true
eval_interval_s = 600.0

[algorithm.prague-static]
workers_per_node = 2

[algorithm.prague-smart]
group_size = 2
"""

#: The half-minute cases, one of them a day, in turn (each within seventeen days): the three
#: chaos suites (tests/distributed/test_chaos.py), and the multi-host suites' cases: how runs
#: start across hosts (torchrun and mpirun through the bed's agent, a SLURM cluster, torchrun
#: through ssh), a host whose clock is 50 ms ahead (comm/clock.py's own tests run every day),
#: and the three host faults under torchrun, mpirun and SLURM
#: (tests/distributed/test_multihost_faults.py).
HALF_MINUTE_CASES = ["test_chaos", "torchrun", "link_down", "test_chaos_launcher_deaths", "mpi",
                     "host_killed", "slurm", "test_chaos_on_the_results_directory", "ssh",
                     "services_host_lost", "clock", "mpi:link_down", "slurm:host_killed",
                     "mpi:services_host_lost", "slurm:link_down", "mpi:host_killed",
                     "slurm:services_host_lost"]


#: The quarter-minute cases of the one-host suites (8-22 s each on a 2-core machine, the
#: slowest tests outside the half-minute ones), two a day, in turn (each within five days), so
#: that CI stays under 20 minutes: a plugin written from the public API, real and simulated
#: (test_template_and_plugins.py) and a hybrid plugin's simulated half (test_plugin_hybrid.py);
#: `--target` (test_target_flag.py); `bench tune` (test_tune_cli.py); `bench sim` refused
#: while a run writes (test_results_dir_lock.py); twice the pacing, twice the time to target
#: (test_time_to_target.py); the one-host note (test_host_note.py); `--plugin` under torchrun
#: and `bench sim`'s skip and --force (test_plugin_flag.py); three seeds' intervals in every
#: table (tests/reports/test_verdicts.py).
QUARTER_MINUTE_CASES = ["hypercube-plugin", "target-flag", "tune", "plugin-simulated-half",
                        "sim-refused-while-writing", "twice-the-pacing", "host-note",
                        "plugin-torchrun", "sim-skip-force", "three-seed-intervals"]


#: Slow tests that cross paths a test of every CI run crosses too (a plugin's flag, a
#: simulation's signals and records, report fixtures): CI runs four of them a day, in turn, so
#: that its whole run stays within 20 minutes; HETBENCH_TEST_ALL=1 runs them all.
SLOW_VARIANT_CASES = ["sim-timing-from-a-matrix", "layout-cache", "sim-sigterm",
                      "big-simulation-records", "hybrid-plugin-attributed",
                      "report-of-hop-alone", "plugin-flag-uninstalled", "entry-point-plugin",
                      "hop-neighbours-far-apart", "killed-group-generator",
                      "adpsgd-past-comm-timeout", "compare-and-report-fixtures"]


def cases_of_today(cases: list[str], per_day: int = 1) -> list[str]:
    """Today's `per_day` of `cases`, in turn: every case runs within len(cases) / per_day
    days."""
    start = rotation_day() * per_day
    return [cases[(start + i) % len(cases)] for i in range(min(per_day, len(cases)))]


def is_today(case: str, cases: list[str], per_day: int = 1) -> bool:
    """Whether `case` is among today's of `cases`: suites whose cases each take many seconds
    (chaos, runs across hosts, host faults, bench's signals, stragglers' faults) run a few a
    day, in turn, so that CI stays within its time and every case runs within a few days.
    HETBENCH_TEST_ALL=1 runs them all."""
    return os.environ.get("HETBENCH_TEST_ALL") == "1" or case in cases_of_today(cases, per_day)


def skip_unless_today(case: str, cases: list[str], per_day: int = 1) -> None:
    """pytest.skip unless is_today(case, cases, per_day), saying which are today's."""
    import pytest

    if not is_today(case, cases, per_day):
        today = ", ".join(cases_of_today(cases, per_day))
        pytest.skip(f"rotated by day: today's {'is' if per_day == 1 else 'are'} {today} "
                    f"(HETBENCH_TEST_DAY={rotation_day()}; HETBENCH_TEST_ALL=1 runs every one)")


def sim_only_algorithm(monkeypatch, name: str, protocol: type) -> str:
    """Register, for one test, an algorithm `name` that bench sim plays with `protocol` (a test
    protocol) and whose real step synchronizes nothing; returns its name."""
    from hetbench.api import Algorithm, StepInfo
    from hetbench.core.registry import ALGORITHMS

    algorithm = type(f"Test{protocol.__name__}", (Algorithm,), {
        "name": name, "description": f"a test of bench sim: {protocol.__name__}",
        "simulated_protocol": classmethod(lambda cls: protocol),
        "step": lambda self, ctx, model, optimizer: StepInfo(peers=0)})
    ALGORITHMS.names()  # load plugins first, so the add below is not overwritten
    monkeypatch.setitem(ALGORITHMS._targets, name, algorithm)
    return name


def run_config(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Run one RunConfig(**fields) on real worker processes; returns its summary."""
    config = RunConfig(**fields)
    return LocalLauncher().run(config, run_dir)


def events(run_dir: Path, workers: int) -> dict[int, list[dict[str, Any]]]:
    return {r: read_jsonl(run_dir / f"events.rank{r}.jsonl")[0] for r in range(workers)}


def final_models(run_dir: Path, workers: int) -> list[np.ndarray]:
    """Each worker's final flat parameters (the run needs save_models=True)."""
    return [np.load(run_dir / f"model.rank{r}.npy", allow_pickle=False) for r in range(workers)]


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def _rank_entry(fn, rank, world_size, port, timeout_s, args, queue, device_type="cpu"):
    import torch

    from hetbench.comm.comm import Comm

    torch.set_num_threads(1)
    # As the worker picks a GPU: by local rank, several ranks to a GPU when they outnumber them.
    device = (torch.device("cuda", rank % torch.cuda.device_count()) if device_type == "cuda"
              else torch.device("cpu"))
    try:
        comm = Comm.connect(rank, world_size, "127.0.0.1", port, device, timeout_s,
                            local_rank=rank)
        try:
            queue.put((rank, "ok", fn(comm, *args)))
        finally:
            comm.close()
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def on_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 60.0,
             device_type: str = "cpu") -> list:
    """Run fn(comm, *args) on `world_size` real ranks (gloo on CPU; with device_type="cuda", the
    ranks spread over the GPUs: NCCL with one GPU per rank, gloo where they share one); returns
    each rank's result in order.

    `fn` must be a module-level function (it is pickled to the forked ranks).
    """
    import torch.distributed as dist

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "hetbench.comm.comm"])
    store = dist.TCPStore("127.0.0.1", 0, None, True,
                          timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_entry,
                         args=(fn, r, world_size, store.port, timeout_s, args, queue,
                               device_type))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors = []
    try:
        for _ in range(world_size):
            rank, status, value = queue.get(timeout=timeout_s + 30)
            if status == "ok":
                results[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world_size)]
