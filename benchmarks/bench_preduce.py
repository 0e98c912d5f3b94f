"""P-Reduce against dist.all_reduce on a standing group, and the cost of a new member group.

    .venv/bin/pytest benchmarks/bench_preduce.py --benchmark-columns=min,median,mean,stddev,rounds

This pytest process is rank 0 of a real 8-rank gloo world; ranks 1-7 are subprocesses that run
the same operations in lock step (told through the store which case comes next). Each case
times rank 0's view of one collective over the first g ranks (g = 2, 4, 8):
  - allreduce: dist.all_reduce on a process group of those ranks made up front (new_group by
    the whole world), then the division by g: the group mean, the best torch offers when the
    members are known in advance;
  - preduce: Comm.p_reduce_ on a cached member communicator (cache hit: each member claims the
    use with one store compare_set, then the all-reduce, the division by g);
  - agree: Comm.member_group alone on a cache hit: the fixed cost P-Reduce adds to the reduce;
  - create: Comm.p_reduce_ of one float on a member set none of them holds (the claim, a new
    gloo communicator under a fresh store prefix, its first collective): a cache miss;
  - paired: the ratio the target is about. The separate allreduce and preduce cases run one
    after the other, so on a shared machine each meets a different background load. Here every
    round runs one allreduce and one preduce back to back on the same tensor size and warm
    communicators (alternating which goes first, so neither always follows the other), and
    extra_info holds each side's median and their ratio (preduce / allreduce).
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import statistics
import time

import pytest
import torch
import torch.distributed as dist

from hetbench.comm.comm import Comm

WORLD = 8
GROUP_SIZES = (2, 4, 8)
SIZES = {"256KB": 2**16, "4MB": 2**20}
ROUNDS, WARMUP = 20, 3
PAIRED_ROUNDS = 60
TIMEOUT_S = 120.0


def _groups_in_setup_order() -> dict[int, object]:
    # Collective over the world: every rank creates these in the same order.
    return {g: (dist.new_group(list(range(g))) if g < WORLD else None) for g in GROUP_SIZES}


def _run_case(comm: Comm, groups: dict, case: dict) -> None:
    """One case's operations on this rank (rank 0 calls the same per benchmark round)."""
    members = list(range(case["g"]))
    tensor = torch.ones(case["numel"])
    if comm.rank not in members:
        return
    if case["op"] == "paired":
        for i in range(case["reps"]):
            _pair(comm, groups, members, tensor, i, [])
        return
    for _ in range(case["reps"]):
        _op(comm, groups, case["op"], members, tensor)


def _pair(comm: Comm, groups: dict, members: list[int], tensor: torch.Tensor, i: int,
          times: list) -> None:
    """One paired round: allreduce and preduce back to back, order alternating with i."""
    order = ("allreduce", "preduce") if i % 2 == 0 else ("preduce", "allreduce")
    for op in order:
        start = time.perf_counter()
        _op(comm, groups, op, members, tensor)
        times.append((op, time.perf_counter() - start))


def _op(comm: Comm, groups: dict, op: str, members: list[int], tensor: torch.Tensor) -> None:
    if op == "allreduce":
        # The same mean P-Reduce computes (Comm.average_ does this on a standing group).
        dist.all_reduce(tensor, group=groups[len(members)])
        tensor.div_(len(members))
    elif op == "preduce":
        comm.p_reduce_(tensor, members)
    elif op == "agree":
        comm.member_group(members)  # the claim of the use alone, on a cache hit
    elif op == "create":
        # A group is always used once made: a new one costs creation plus its first (tiny)
        # collective, which is also what keeps a member from closing it while peers still
        # connect to it.
        comm.close_member_groups(wait=False)  # destroyed in the background, as in a run
        comm.p_reduce_(tensor, members)


def _helper(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    comm = Comm.connect(rank, WORLD, "127.0.0.1", port, torch.device("cpu"), TIMEOUT_S)
    groups = _groups_in_setup_order()
    i = 0
    while True:
        case = json.loads(comm.store.get(f"bench/case/{i}"))
        if case["op"] == "quit":
            break
        _run_case(comm, groups, case)
        i += 1
    comm.close()


class World:
    """Rank 0 in this process; tells the helpers each case before timing it."""

    def __init__(self):
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "hetbench.comm.comm"])
        self.master = dist.TCPStore("127.0.0.1", 0, None, True,
                                    timeout=datetime.timedelta(seconds=TIMEOUT_S),
                                    wait_for_workers=False)
        self.procs = [ctx.Process(target=_helper, args=(r, self.master.port))
                      for r in range(1, WORLD)]
        for p in self.procs:
            p.start()
        torch.set_num_threads(1)
        self.comm = Comm.connect(0, WORLD, "127.0.0.1", self.master.port, torch.device("cpu"),
                                 TIMEOUT_S)
        self.groups = _groups_in_setup_order()
        self.cases = 0

    def announce(self, case: dict) -> None:
        self.comm.store.set(f"bench/case/{self.cases}", json.dumps(case))
        self.cases += 1

    def close(self) -> None:
        self.announce({"op": "quit"})
        self.comm.close()
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


@pytest.fixture(scope="module")
def world():
    w = World()
    yield w
    w.close()


def _bench(benchmark, world: World, op: str, g: int, numel: int) -> None:
    members = list(range(g))
    tensor = torch.ones(numel)
    if op in ("preduce", "agree"):  # cache-hit cases: make the communicator before timing
        world.announce({"op": "preduce", "g": g, "numel": numel, "reps": 1})
        world.comm.p_reduce_(tensor, members)
    world.announce({"op": op, "g": g, "numel": numel, "reps": ROUNDS + WARMUP})
    benchmark.extra_info.update({"world": WORLD, "group_size": g, "floats": numel})
    benchmark.pedantic(_op, args=(world.comm, world.groups, op, members, tensor),
                       rounds=ROUNDS, iterations=1, warmup_rounds=WARMUP)


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("op", ["allreduce", "preduce"])
def test_reduce(benchmark, world, op, g, size):
    benchmark.group = f"reduce {size} g={g}"
    _bench(benchmark, world, op, g, SIZES[size])


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("g", GROUP_SIZES)
def test_paired_ratio(benchmark, world, g, size):
    benchmark.group = "paired allreduce + preduce (ratio in extra_info)"
    members, numel = list(range(g)), SIZES[size]
    tensor = torch.ones(numel)
    world.announce({"op": "preduce", "g": g, "numel": numel, "reps": 1})  # warm communicator
    world.comm.p_reduce_(tensor, members)
    world.announce({"op": "paired", "g": g, "numel": numel, "reps": PAIRED_ROUNDS + WARMUP})
    times: list = []
    rounds = iter(range(PAIRED_ROUNDS + WARMUP))
    benchmark.pedantic(lambda: _pair(world.comm, world.groups, members, tensor, next(rounds),
                                     times), rounds=PAIRED_ROUNDS, iterations=1,
                       warmup_rounds=WARMUP)
    timed = times[2 * WARMUP:]
    allreduce = statistics.median(t for op, t in timed if op == "allreduce")
    preduce = statistics.median(t for op, t in timed if op == "preduce")
    benchmark.extra_info.update({
        "world": WORLD, "group_size": g, "floats": numel,
        "allreduce_median_ms": allreduce * 1e3, "preduce_median_ms": preduce * 1e3,
        "ratio": preduce / allreduce})


@pytest.mark.parametrize("g", GROUP_SIZES)
def test_create_member_group(benchmark, world, g):
    benchmark.group = "new member group"
    _bench(benchmark, world, "create", g, 1)


@pytest.mark.parametrize("g", GROUP_SIZES)
def test_agreement_on_a_cache_hit(benchmark, world, g):
    benchmark.group = "claim of a use (cache hit)"
    _bench(benchmark, world, "agree", g, 1)
