"""What a simulated run leaves behind, as a real one would: per worker, every step's span and
times in compact arrays for the summary, (full mode) the event lines of events.rank<r>.jsonl,
written by the same core.record.step_event and core.store.jsonl_line as the worker loop's, and
(when the algorithm's summary_facts reads events) what it needs to rebuild those events."""

from __future__ import annotations

import bisect
import itertools
import json
import math
import re
import struct
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hetbench.core.config import RunConfig
from hetbench.core.metrics import TIME_KEYS, SyncTally
from hetbench.core.record import HARNESS_KEYS, encode_fields, logged_peer_ranks, step_event
from hetbench.core.rundir import RunDir
from hetbench.core.store import jsonl_line, write_json_atomic
from hetbench.core.summary import SummaryInputs, summary_body
from hetbench.errors import UserError

#: An event's six record values as bytes: array.frombytes of them is a third of the time of
#: extend() with a tuple, once per simulated worker-iteration.
_SIX_DOUBLES = struct.Struct("6d").pack

#: Events buffered per worker before they are appended to its log (bounds memory at scale).
FLUSH_EVERY = 512


#: `bench sim --events`: full (every worker-iteration as a line, like a real run), workers
#: (one record per worker: workers.json), or auto (full up to FULL_EVENTS_UP_TO workers).
EVENT_MODES = ("auto", "full", "workers")
FULL_EVENTS_UP_TO = 64


def full_events(mode: str, workers: int) -> bool:
    if mode not in EVENT_MODES:
        raise UserError(f"events must be one of {', '.join(EVENT_MODES)}, got {mode!r}")
    return mode == "full" or (mode == "auto" and workers <= FULL_EVENTS_UP_TO)


#: The keys of an event line that a protocol's fields may not repeat: samples, which they may
#: set, and the rest, which they may not (core.record.HARNESS_KEYS).
_LINE_KEYS = HARNESS_KEYS | {"samples"}
#: Where an encoded tail (',"k":v,...') may name one of them: most never do, and one search
#: spares decoding every tail; a match (a nested key or a string value may match too) is
#: decoded to find out.
_MAY_NAME_LINE_KEY = re.compile('"(?:' + "|".join(sorted(_LINE_KEYS)) + ')":')


def decoded_tail(tail: str) -> dict[str, Any]:
    """An encoded tail (encode_fields) as the dict a reader of the line gets."""
    return json.loads("{" + tail[1:] + "}")


def naming_harness_keys(fields: dict | str) -> dict | None:
    """`fields` as a dict when they name a key the harness writes (`samples`, or one step_event
    refuses), else None: their line is then built whole by step_event, one key once."""
    if isinstance(fields, str):
        if _MAY_NAME_LINE_KEY.search(fields) is None:
            return None
        fields = decoded_tail(fields)
    return None if _LINE_KEYS.isdisjoint(fields) else fields


class EventSink:
    """What every simulated worker-iteration leaves: its span and times, kept in compact
    per-worker arrays for the summary, and (full mode) its event line in
    events.rank<r>.jsonl, appended in batches.

    Lines hold the same JSON a real worker's EventLog writes (read back by store.read_jsonl),
    but are formatted here, and protocols may pass fields already encoded (encode_fields) once
    per group: at a million events json.dumps per line was a third of the run time. Without
    full events (thousands of workers: 16,384 x 200 iterations made a GB of lines) a run
    writes workers.json, one record per worker, and bench report reads that. The summary is
    computed from the arrays either way, with the same arithmetic as the harness's (a test
    holds it equal to what core.record.summarize computes from the files).
    """

    def __init__(self, config: RunConfig, run_dir: Path, full: bool = True,
                 keep: bool = False):
        self.run_dir = run_dir
        self.full = full
        #: Whether every step's synchronization and fields are kept to rebuild its event for
        #: the algorithm's summary_facts (kept_events): only for an algorithm whose facts read
        #: events (engine.facts_read_events), whose protocol then formats its fields at every
        #: scale, and the lockstep path goes worker by worker.
        self.keep = keep
        #: Whether the protocol's fields are wanted (Engine.full_events): lines, or facts.
        self.wants_fields = full or keep
        self.run_id = config.run_id
        self._algorithm = config.algorithm_class()
        # With [timing], the timing workload's batch: throughput is what its job would process
        # on the simulated machines (the learning's own batch is the learner's business).
        self.samples = config.timing_config.workload_options["batch_size"]
        self._buffers: dict[int, list[str]] = {}
        n = self.workers = config.workers
        #: Per rank, six doubles per event: t_start, t_end, compute, slowdown, comm and wait
        #: seconds (one extend per event; settle() derives the arrays below from them).
        self.records = [array("d") for _ in range(n)]
        #: Per rank, the indices of its events whose gradient was dropped (no samples).
        self.dropped_at: dict[int, list[int]] = {}
        #: Per rank, {event index: samples} of its events whose fields set samples.
        self.samples_at: dict[int, dict[int, int]] = {}
        #: Per rank (keep), one (iteration, peers, staleness, peer_ranks as logged, fields as
        #: an encoded tail or None) per event.
        self.kept: list[list[tuple]] = [[] for _ in range(n)] if keep else []
        #: Derived by settle(), per rank, one entry per event: start and end (ns), samples;
        #: compute, slowdown, comm and wait seconds (summed exactly).
        self.starts: list[array] = []
        self.ends: list[array] = []
        self.counted: list[array] = []
        self.times: list[list[array]] = []
        self.last_iteration: list[int | None] = [None] * n
        self.sync = SyncTally()
        self.discarded = 0
        #: Lockstep iterations not yet moved into the records: (t_start, t_end, compute,
        #: slowdown, comm, wait), one array over the workers each (settle()).
        self._columns: list[tuple[np.ndarray, ...]] = []
        #: How many record values the derived arrays were last derived from.
        self._settled = -1

    def add(self, rank: int, iteration: int, t_start: float, t_end: float, compute_s: float,
            slowdown_s: float, comm_s: float, wait_s: float, fields: dict | str | None,
            peers: int | None = None, staleness: float | None = None,
            discarded: bool = False, peer_ranks=None, samples: int | None = None) -> None:
        """One worker-iteration; `samples`: what its step computed where the protocol decides
        the work (Protocol.work; None: the batch size)."""
        record = self.records[rank]
        if samples is not None:
            self.samples_at.setdefault(rank, {})[len(record) // 6] = samples
        if discarded:  # as the real worker logs a dropped gradient (StepInfo.discarded)
            self.discarded += 1
            self.dropped_at.setdefault(rank, []).append(len(record) // 6)
        if peers is not None:
            self.sync.add(peers, staleness)
        record.frombytes(_SIX_DOUBLES(t_start, t_end, compute_s, slowdown_s, comm_s, wait_s))
        self.last_iteration[rank] = iteration
        if not self.wants_fields:
            return
        named = None if not fields else naming_harness_keys(fields)
        if named is not None:
            fields = named
            self._check(rank, iteration, named, len(record) // 6 - 1)
        elif fields and not isinstance(fields, str):
            fields = encode_fields(fields)
        ranks = logged_peer_ranks(peer_ranks, rank, self.workers)
        if self.keep:
            # Encoded, so that decoded the event holds what a reader of its line would get.
            tail = fields if named is None else encode_fields(named)
            self.kept[rank].append((iteration, peers, staleness, ranks, tail or None))
        if not self.full:
            return
        # The real worker's event (core.record.step_event), its fields encoded once by the
        # protocol where it passes them as a string; fields naming a harness key (samples)
        # go through step_event, which writes each key once.
        event = step_event(self.run_id, rank, iteration, round(t_start * 1e9),
                           round(t_end * 1e9), compute_s, slowdown_s, comm_s, wait_s,
                           self.samples if samples is None else samples, peers=peers,
                           staleness=staleness, peer_ranks=ranks, discarded=discarded,
                           fields=named)
        line = jsonl_line(event, "" if named is not None else fields or "")
        buffer = self._buffers.get(rank)
        if buffer is None:
            buffer = self._buffers[rank] = []
        buffer.append(line)
        if len(buffer) >= FLUSH_EVERY:
            self._flush(rank)

    def _check(self, rank: int, iteration: int, fields: dict, index: int) -> None:
        """Fields naming a harness key: refused (one line naming the protocol) unless the key
        is samples, which the summary then counts, as a real run's summarize counts the
        line's samples."""
        try:
            event = step_event(self.run_id, rank, iteration, 0, 0, 0.0, 0.0, 0.0, 0.0,
                               self.samples, fields=fields)
        except ValueError as exc:
            protocol = self._algorithm.simulated_protocol()
            raise UserError(f"{self._algorithm.name}'s simulated protocol {protocol.__name__} "
                            f"(worker {rank}, iteration {iteration}): {exc}") from None
        self.samples_at.setdefault(rank, {})[index] = event["samples"]

    def add_all(self, iteration: int, t_start: np.ndarray, t_end: np.ndarray,
                compute_s: np.ndarray, slowdown_s: np.ndarray, comm_s: np.ndarray,
                wait_s: np.ndarray, steps, samples: list | None = None) -> None:
        """add() for every worker's step of one lockstep iteration (Steps: peers, staleness,
        fields; `samples`: one per worker where the protocol decides the work), in rank order.
        Without event lines (nor samples of their own) the columns are kept as arrays and
        moved into the records once (settle), not one Python call per worker-iteration."""
        n = len(t_start)
        peers = steps.peers
        if self.wants_fields or samples is not None:
            columns = [c.tolist() for c in (t_start, t_end, compute_s, slowdown_s, comm_s, wait_s)]
            peer_list = peers.tolist() if isinstance(peers, np.ndarray) else [peers] * n
            fields = steps.fields or [None] * n
            peer_ranks = steps.peer_ranks or [None] * n
            staleness = steps.staleness
            if not isinstance(staleness, list):
                staleness = [staleness] * n
            counts = samples or [None] * n
            for rank, (a, b, c, d, e, f) in enumerate(zip(*columns, strict=True)):
                self.add(rank, iteration, a, b, c, d, e, f, fields[rank], peer_list[rank],
                         staleness[rank], peer_ranks=peer_ranks[rank], samples=counts[rank])
            return
        self.sync.add_all(peers if isinstance(peers, np.ndarray) else np.full(n, peers),
                          steps.staleness)
        self._columns.append((t_start, t_end, compute_s, slowdown_s, comm_s, wait_s))
        self.last_iteration = [iteration] * n

    def settle(self) -> None:
        """Move kept lockstep columns into the records, then derive the per-rank arrays from
        the records (times in ns rounded as add()'s lines round them: half to even)."""
        settled = sum(len(r) for r in self.records) + 6 * len(self._columns) * len(self.records)
        if settled == self._settled:
            return
        self._settled = settled
        if self._columns:
            stacked = np.stack([np.stack(c, axis=1) for c in self._columns], axis=1)
            self._columns = []
            for record, rows in zip(self.records, stacked, strict=True):  # rows: (events, 6)
                record.frombytes(rows.tobytes())
        self.starts, self.ends, self.counted, self.times = [], [], [], []
        for rank, record in enumerate(self.records):
            events = np.frombuffer(record, dtype=np.float64).reshape(-1, 6)
            self.starts.append(array("q", np.rint(events[:, 0] * 1e9).astype(np.int64).tobytes()))
            self.ends.append(array("q", np.rint(events[:, 1] * 1e9).astype(np.int64).tobytes()))
            counted = np.full(len(events), self.samples, dtype=np.int_)
            for index, samples in self.samples_at.get(rank, {}).items():
                counted[index] = samples
            counted[self.dropped_at.get(rank, [])] = 0
            self.counted.append(array("l", counted.tobytes()))
            self.times.append([array("d", np.ascontiguousarray(events[:, i]).tobytes())
                               for i in range(2, 6)])

    def _flush(self, rank: int) -> None:
        lines = self._buffers.pop(rank, [])
        if lines:
            with RunDir(self.run_dir).events(rank).open("a") as f:
                f.write("".join(lines))

    def close(self) -> None:
        self.settle()
        for rank in list(self._buffers):
            self._flush(rank)
        if not self.full:
            write_json_atomic(RunDir(self.run_dir).workers, {"workers": self.per_worker()})

    def kept_events(self) -> KeptEvents | list:
        """Every worker's events, rank by rank, as a real run's summarize reads them from its
        lines (kept: built one at a time as they are read), or [] when none were kept."""
        self.settle()
        return KeptEvents(self) if self.keep else []

    def per_worker(self) -> list[dict[str, Any]]:
        """One record per worker: its iterations, first start and last end (ns), samples and
        summed times (what a report needs when there are no event lines)."""
        self.settle()
        records = []
        for rank, (starts, ends) in enumerate(zip(self.starts, self.ends, strict=True)):
            records.append({
                "rank": rank, "iterations": len(starts),
                "last_iteration": self.last_iteration[rank],
                "t_start": starts[0] if starts else None,
                "t_end": max(ends) if ends else None,
                "samples": sum(self.counted[rank]),
                **{key: math.fsum(column)
                   for key, column in zip(TIME_KEYS, self.times[rank], strict=True)},
            })
        return records

    def summary(self, config: RunConfig) -> dict[str, Any]:
        """What core.record.summarize would compute from the files written (a test holds them
        equal): core.summary.summary_body over the arrays kept, never an event's dict."""
        self.settle()
        return summary_body(config, SummaryInputs(
            starts=self.starts, ends=self.ends, samples=self.counted,
            last_iterations=self.last_iteration, sync=self.sync.health(),
            times={key: math.fsum(itertools.chain.from_iterable(
                       per_rank[i] for per_rank in self.times))
                   for i, key in enumerate(TIME_KEYS)},
            gradients_dropped=self.discarded,
            events="full" if self.full else "workers"))


class KeptEvents(Sequence):
    """A simulated run's events as its lines would read (step_event, the fields decoded), built
    from the sink's arrays and kept fields as they are iterated: at thousands of workers the
    dicts of every event at once would take gigabytes, the kept tuples a tenth of that."""

    def __init__(self, sink: EventSink):
        self._sink = sink
        self._offsets = list(itertools.accumulate((len(k) for k in sink.kept), initial=0))

    def __len__(self) -> int:
        return self._offsets[-1]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("event index out of range")
        rank = bisect.bisect_right(self._offsets, index) - 1
        return self._event(rank, index - self._offsets[rank], set(
            self._sink.dropped_at.get(rank, ())))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for rank, kept in enumerate(self._sink.kept):
            dropped = set(self._sink.dropped_at.get(rank, ()))
            for i in range(len(kept)):
                yield self._event(rank, i, dropped)

    def _event(self, rank: int, i: int, dropped: set[int]) -> dict[str, Any]:
        sink = self._sink
        iteration, peers, staleness, peer_ranks, fields = sink.kept[rank][i]
        t_start, t_end, compute_s, slowdown_s, comm_s, wait_s = \
            sink.records[rank][6 * i:6 * i + 6]
        if isinstance(fields, str):
            fields = decoded_tail(fields)
        return step_event(sink.run_id, rank, iteration, round(t_start * 1e9),
                          round(t_end * 1e9), compute_s, slowdown_s, comm_s, wait_s,
                          sink.samples_at.get(rank, {}).get(i, sink.samples), peers=peers,
                          staleness=staleness,
                          peer_ranks=peer_ranks, discarded=i in dropped, fields=fields)
