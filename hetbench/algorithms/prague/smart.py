"""prague-smart: groups from the smart Group Generator, a gRPC service in its own process.

The defaults are the paper's Group Generator (Luo et al., "Prague: High-Performance
Heterogeneity-Aware Asynchronous Decentralized Training", ASPLOS 2020): random conflict-free
groups from Group Division, an unbounded Group Buffer per worker, and the one-sided threshold rule
(w joins requester i's groups only if c_w > c_i - delta_c). group_size 2 and delta_c 4 are
hetbench's choices (the slides give no values; generator.py says why delta_c must exceed 2).

hetbench's variants, all off by default because they depart from the paper (generator.py and
docs/results/2026-11-22-prague-generator-variants.md have the measurements): `threshold_rule =
"pairwise"`, a `buffer_limit`, and `arrival_order` (members chosen by when the server expects
them to ask next).
finish() tells the generator the worker is done, then drains the groups already queued for it,
so no peer is left waiting in a group with a worker that has stopped; those P-Reduces come after
the worker's last iteration and are counted in done.rank<r>.json.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hetbench.algorithms.prague.common import PragueBase, PragueOptions
from hetbench.algorithms.prague.generator import Group, GroupGenerator
from hetbench.core.options import opt
from hetbench.core.store import SERVICE_CPU_FILE
from hetbench.errors import UserError
from hetbench.sim.protocol import Meetings, Protocol


@dataclass(frozen=True, kw_only=True)
class PragueSmartOptions(PragueOptions):
    group_size: int = opt(2, "workers per generated group")
    delta_c: int = opt(4, "threshold rule: a worker delta_c or more requests behind is left out")
    threshold_rule: Literal["requester", "pairwise"] = opt(
        "requester", "requester: the paper's c_w > c_requester - delta_c; pairwise (hetbench's "
                     "variant): every pair of members within delta_c")
    group_division: bool = opt(True, "one request partitions all eligible workers into groups")
    group_buffer: bool = opt(True, "queue groups for busy workers (else only idle ones join)")
    buffer_limit: int = opt(0, "most groups queued per worker (0 = unbounded, the paper's); a "
                               "worker with a full buffer is left out of new groups")
    arrival_order: bool = opt(False, "hetbench's variant: group workers expected to ask at about "
                                     "the same time (from their request times), late ones last")

    def __post_init__(self):
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2, got {self.group_size}")
        if self.delta_c < 1:
            raise ValueError(f"delta_c must be >= 1, got {self.delta_c}")
        if self.buffer_limit < 0:
            raise ValueError(f"buffer_limit must be >= 0, got {self.buffer_limit}")


class GeneratedGroups(PragueBase):
    """Groups asked of a Group Generator server that the run's services() started."""

    @classmethod
    def generator_spec(cls, config, workers: int) -> dict:
        raise NotImplementedError

    @classmethod
    def simulated_protocol(cls):
        return PragueGeneratedSim

    @classmethod
    def validate(cls, config, workers):
        if config.group_size > workers:
            raise UserError(f"algorithm {cls.name}: group_size ({config.group_size}) must be "
                            f"<= workers ({workers})")

    @classmethod
    @contextlib.contextmanager
    def services(cls, run, run_dir: Path):
        from hetbench.algorithms.prague.service import gg_server

        spec = {**cls.generator_spec(run.algorithm_config(), run.workers),
                "workers": run.workers, "seed": run.seed}
        with gg_server(spec, log_path=run_dir / "gg.log", host=run.bind_host,
                       cpu_path=run_dir / SERVICE_CPU_FILE.format(name="gg")) as services:
            yield services

    def setup(self, ctx, model, optimizer):
        from hetbench.algorithms.prague.service import GroupClient

        super().setup(ctx, model, optimizer)
        self._client = GroupClient(ctx.services["gg_address"], ctx.comm.timeout.total_seconds())

    def next_group(self, ctx):
        # The Group Generator serves from rank 0's node: under a network model its RPC pays
        # that round trip.
        reply = ctx.comm.rpc(0, lambda: self._client.group(ctx.rank))
        return tuple(reply.members), {"group_id": reply.group_id}

    def finish(self, ctx, model):
        self._client.done(ctx.rank)

        def queued():
            while not (reply := self._client.group(ctx.rank)).finished:
                yield tuple(reply.members)

        record = self.drain(ctx, queued())
        self._client.close()
        self.release(ctx)
        return record


class PragueSmart(GeneratedGroups):
    name = "prague-smart"
    description = ("Prague, smart GG (gRPC): random conflict-free groups, Group Division/Buffer, "
                   "stragglers left out by the threshold rule")
    Config = PragueSmartOptions

    @classmethod
    def generator_spec(cls, config, workers):
        return {"group_size": config.group_size, "delta_c": config.delta_c,
                "group_division": config.group_division, "group_buffer": config.group_buffer,
                "buffer_limit": config.buffer_limit or None,
                "arrival_order": config.arrival_order, "threshold_rule": config.threshold_rule}


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class PragueGeneratedSim(Protocol):
    """prague-smart / prague-random: groups from the Group Generator, a server one alpha away.

    The generator is the real one (prague.generator.GroupGenerator) with the arguments the real
    algorithm's services() gives it, driven by requests in simulated-time order. Its server
    answers one request at a time, in arrival order, each taking network.gg_request_s (the
    real one is a single Python gRPC process: about 1 ms per request on the validation
    machine), so requests queue when many workers ask at once.
    """

    #: Its collectives run through after_rings (fair transport: as flows).
    transport_ready = True

    def __init__(self, engine):
        super().__init__(engine)
        cls = engine.config.algorithm_class()
        spec = cls.generator_spec(self.config, self.n)
        if engine.recorded_order is not None:  # a real run's groups (sim/recorded.py)
            self.gg = RecordedGroups(engine.recorded_order)
        else:
            self.gg = GroupGenerator(self.n, spec.pop("group_size"), seed=engine.config.seed,
                                     **spec)
        # One way from each worker to the server (on rank 0's node); a round trip is twice.
        self.rpc = [self.net.rpc_one_way(w) for w in range(self.n)]
        self.service = self.net.gg_request_s
        self.gg_free = 0.0
        self.meetings = Meetings(self)
        #: Event fields of each open group, encoded once for all its members.
        self._fields: dict[int, str] = {}

    def _serve(self, w: int) -> float:
        """A request sent now: when the server takes it (messages arrive in the order they
        are sent, so the generator is called here, in that order: FIFO)."""
        served = max(self.gg_free, self.engine.now + self.rpc[w])
        self.gg_free = served + self.service
        return served

    def _ask(self, w: int):
        """w asks for its next group now: (the group, or None once w is drained; when the
        reply reaches w). Every request carries the time the server takes it, as the real
        server stamps every request with its clock, those of finish() included."""
        served = self._serve(w)
        return self.gg.request(w, served), self.gg_free + self.rpc[w]

    learns_events = True

    @classmethod
    def recorded_order(cls, logs, done):
        """Each worker's groups in the order it took them: its steps' (logged with their id),
        then those it drained in finish(), which only the other members logged: the groups
        with w that w did not log, in id order (the generator queues a worker's groups in the
        order it made them). A group every member drained is in no log; the done records'
        counts of drained groups say whether one is missing (ValueError)."""
        members, logged = {}, {}
        for w, steps in logs.items():
            logged[w] = [int(step["group_id"]) for step in steps]
            for step in steps:
                members[int(step["group_id"])] = tuple(step["group"])
        sequences = {}
        for w in logs:
            own = set(logged[w])
            drained = sorted(g for g, group in members.items() if w in group and g not in own)
            averaged = sum(len(set(members[g])) > 1 for g in drained)
            if averaged != done[w].get("averagings_after_training", 0):
                raise ValueError(f"worker {w} drained {done[w].get('averagings_after_training')} "
                                 f"groups after training; the other members' logs name "
                                 f"{averaged}")
            sequences[w] = [Group(g, members[g]) for g in logged[w] + drained]
        return sequences

    def ready(self, w):
        if (learner := self.engine.learner) is not None:
            learner.worker_step(w, learner.gradient(w))  # the real step: update, then group
        group, reply = self._ask(w)
        if not self.engine.full_events:  # no event lines: no fields to format ("" is not None)
            self.meetings.join(group.id, group.members, w, reply, "")
            return
        fields = self._fields.get(group.id)
        if fields is None:
            # What encode_fields would give, formatted directly: at 1024 workers this runs half
            # a million times, and json.dumps was a tenth of the simulation's time.
            members = ",".join(map(str, group.members))
            fields = self._fields[group.id] = f',"group":[{members}],"group_id":{group.id}'
        own = f',"gg_s":{reply - self.engine.now!r}{fields}'
        if self.meetings.join(group.id, group.members, w, reply, own):
            del self._fields[group.id]

    def met(self, w, end, wait_s, fields, peers, staleness):
        if fields is None:  # a group of finish()
            self.engine.at(end, self._drain, w)
        else:
            self.engine.end_step(w, end, wait_s, fields, peers=peers, staleness=staleness)

    def finish(self, w, t):
        self._serve(w)
        self.gg.finish(w)  # Done
        self.engine.at(self.gg_free + self.rpc[w], self._drain, w)

    def _drain(self, w):
        """finish(): P-Reduce the groups already queued for w, then stop."""
        group, reply = self._ask(w)
        if group is None:
            self.engine.done(w)
            return
        if self.meetings.join(group.id, group.members, w, reply, None):
            self._fields.pop(group.id, None)


class RecordedGroups:
    """The Group Generator's answers in a real run, from its record (PragueGeneratedSim.
    recorded_order): each worker gets the groups it got there, in that order."""

    def __init__(self, sequences: dict[int, list[Group]]):
        self.queues = {w: deque(groups) for w, groups in sequences.items()}
        self.done: set[int] = set()

    def request(self, worker: int, now: float | None = None) -> Group | None:
        queue = self.queues[worker]
        if worker in self.done:
            return queue.popleft() if queue else None
        if not queue:
            raise RuntimeError(f"worker {worker} asked for more groups than the real run gave it")
        return queue.popleft()

    def finish(self, worker: int) -> int:
        self.done.add(worker)
        return len(self.queues[worker])
