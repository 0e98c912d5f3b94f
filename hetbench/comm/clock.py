"""How far each rank's clock is from rank 0's: NTP-style exchanges at a run's start and end.

Every event is stamped with its host's CLOCK_REALTIME, and the reports compare stamps across
ranks (the common start, waits and their attribution, timelines, time to target). On one host
there is one clock; across machines the clocks differ by whatever NTP leaves, from under a
millisecond to tens of milliseconds unsynchronized, against iterations of 10-20 ms. As Intel's
Trace Collector and Open MPI's mpisync do, rank 0 exchanges timestamps with every other rank:

    rank r: t1 = now, send t1        rank 0: t2 = now on receipt, t3 = now, send (t2, t3)
    rank r: t4 = now on receipt
    offset = ((t2 - t1) + (t3 - t4)) / 2      (rank 0's clock minus r's)
    round trip = (t4 - t1) - (t3 - t2)

Of SAMPLES exchanges the one with the smallest round trip is kept: the true offset lies within
half its round trip of the estimate (whatever the asymmetry of the two legs), so that half is
the error bound.

What the harness does with them (harness/worker.py): right after joining the world each rank
estimates its offset and from then on stamps everything with `now_ns()`, its clock plus that
offset, i.e. rank 0's time. The common start, snapshot moments, waits and every event line are
then on one clock while the run goes. At the end of training the estimate is made again, on the
aligned clock: what it finds is the drift since the start (plus its error). Both go into the
done records; readers that compare ranks' stamps (core.record.read_events) take the drift as
linear between the two estimates and remove it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

#: What this process adds to time.time_ns() to read rank 0's clock (align_to).
_offset_ns = 0


def now_ns() -> int:
    """This rank's clock, aligned to rank 0's once align_to() has run (one rank a process)."""
    return time.time_ns() + _offset_ns


def align_to(estimate: ClockEstimate | None) -> None:
    """From now on now_ns() reads rank 0's clock, as far as `estimate` knows it (None: this
    is rank 0, or nothing to align)."""
    global _offset_ns
    _offset_ns = 0 if estimate is None else estimate.offset_ns


def applied_offset_ns() -> int:
    return _offset_ns


def machine_id() -> str | None:
    """This kernel's boot id: hosts with the same one are one machine (the test bed's
    namespaces share its cores and, unless libfaketime shifts it, its clock)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


#: Point-to-point tag of the exchanges on the world group (the harness's; 71 and 72 are too).
CLOCK_TAG = 73
SAMPLES = 8


@dataclass(frozen=True)
class ClockEstimate:
    """One estimate of (rank 0's clock - this rank's), with its error bound and when (this
    rank's clock) it was made."""

    offset_ns: int
    error_ns: int
    at_ns: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def estimate_offsets(comm, ranks: list[int], samples: int = SAMPLES,
                     clock=time.time_ns) -> ClockEstimate | None:
    """Every rank of `ranks` (rank 0 first among them, every one calling it): rank 0 answers
    each other rank's `samples` exchanges in turn; each other rank returns its estimate, rank 0
    None. `clock` is the clock estimated (time.time_ns; tests pass a shifted one)."""
    if comm.rank == ranks[0]:
        stamps = torch.zeros(2, dtype=torch.int64, device=comm.device)
        asked = torch.zeros(1, dtype=torch.int64, device=comm.device)
        for peer in ranks[1:]:
            for _ in range(samples):
                comm.recv(asked, peer, tag=CLOCK_TAG)
                received = clock()
                stamps[0], stamps[1] = received, clock()
                comm.send(stamps, peer, tag=CLOCK_TAG)
        return None
    best = None
    sent = torch.zeros(1, dtype=torch.int64, device=comm.device)
    stamps = torch.zeros(2, dtype=torch.int64, device=comm.device)
    for _ in range(samples):
        t1 = clock()
        sent[0] = t1
        comm.send(sent, ranks[0], tag=CLOCK_TAG)
        comm.recv(stamps, ranks[0], tag=CLOCK_TAG)
        t4 = clock()
        t2, t3 = (int(v) for v in stamps.tolist())
        round_trip = (t4 - t1) - (t3 - t2)
        if best is None or round_trip < best[0]:
            best = (round_trip, ((t2 - t1) + (t3 - t4)) // 2, t1)
    round_trip, offset, at = best
    return ClockEstimate(offset_ns=offset, error_ns=max(round_trip // 2, 0), at_ns=at)
