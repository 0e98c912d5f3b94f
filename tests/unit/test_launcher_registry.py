"""core/launchers.py: every launcher registered once, and what reads the registry (the config's
checks, the runner's options, the prepare hint, the capacity rule, the worker's join) gets what
each entry says. The launchers' runs are tests/distributed/test_launchers.py."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from hetbench.comm.rendezvous import JoinRequest, join_local
from hetbench.core.config import RunConfig
from hetbench.core.launchers import KINDS, LAUNCHERS, launcher_kind
from hetbench.errors import UserError
from hetbench.harness.launch import launcher_options
from hetbench.harness.launch.capacity import world_problem

BASE = {"algorithm": "allreduce", "workload": "mlp-digits", "workers": 4}


@pytest.mark.parametrize("name", LAUNCHERS)
def test_each_entry_names_a_launcher_class_and_a_join_that_exist(name):
    kind = KINDS[name]
    if kind.options_table == "slurm":
        pytest.importorskip("submitit")
    starts = kind.load(kind.starts)
    assert inspect.isclass(starts)
    assert {"on_progress", "options"} <= set(inspect.signature(starts).parameters)
    joins = kind.load(kind.joins)
    assert list(inspect.signature(joins).parameters) == ["request"]
    if kind.warm_up is not None:
        assert callable(kind.load(kind.warm_up))


def test_an_unknown_launcher_is_one_line_naming_every_registered_one():
    with pytest.raises(UserError) as refused:
        RunConfig(**BASE, launcher="kubernetes")
    assert str(refused.value) == ("launcher must be one of local, torchrun, mpi, slurm, got "
                                  "'kubernetes'")
    with pytest.raises(UserError, match="launcher must be one of"):
        launcher_kind("kubernetes")


def test_hosts_go_to_the_launchers_that_start_ranks_on_them():
    # What --hosts refuses for the others: tests/unit/test_hosts.py.
    assert [k.name for k in KINDS.values() if k.across_hosts] == ["torchrun", "mpi"]
    config = RunConfig(**BASE, hosts="h1:2,h2:2", launcher="mpi", bind_host="0.0.0.0")
    assert config.hosts == "h1:2,h2:2"


def test_the_runner_hands_slurm_its_table_and_the_host_launchers_the_agent():
    options = launcher_options({"slurm": {"cluster": "local"}}, rsh_agent="bench testbed rsh")
    assert options == {"torchrun": {"rsh_agent": "bench testbed rsh"},
                       "mpi": {"rsh_agent": "bench testbed rsh"},
                       "slurm": {"cluster": "local"}}


@pytest.mark.parametrize("name", LAUNCHERS)
def test_prepare_gives_a_hint_or_the_reason_it_is_refused(name):
    kind = KINDS[name]
    if kind.prepare_hint is None:
        assert kind.no_prepare.startswith("--prepare is for")
        return
    hint = kind.prepare_hint.format(plugins="", plugins_x="", world=8, run_id="r1",
                                    run_dir=Path("/results/r1"))
    assert "hetbench.harness.worker --run-dir /results/r1" in hint


def test_the_capacity_rule_holds_where_every_rank_starts_here():
    huge = {**BASE, "workers": 4096}
    for name in LAUNCHERS:
        config = RunConfig(**huge, launcher=name)
        refused = world_problem(config, cores=2, memory_mb=1e6)
        assert (refused is not None) == KINDS[name].on_this_machine, name


def test_the_local_join_refuses_a_worker_started_without_its_store():
    request = JoinRequest(world_size=2, timeout_s=1.0, bind_host="127.0.0.1",
                          run_dir=Path("."))
    with pytest.raises(UserError, match="needs --rank and --store-port"):
        join_local(request)
