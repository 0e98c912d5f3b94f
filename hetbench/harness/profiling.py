"""Profiling hooks of the worker loop: where an iteration's time goes, on the host and on the
device, for a few iterations of a real run.

    HETBENCH_PROFILE=20:30 bench run matrix.toml --out results/x

profiles iterations 20..49 of every worker with torch.profiler (CPU, and CUDA on a GPU) and
writes, beside its event log, profile.rank<r>.txt (the operators and the loop's parts, by
total time) and profile.rank<r>.json (a Chrome trace, for chrome://tracing or Perfetto). The
loop's parts are labelled `hetbench/<part>`: data, forward_backward, end_compute, step,
bookkeeping (what the harness adds: the step's times, its event line, the kept models).

Off (the default), a part is a no-op: nothing is imported and nothing timed. On, the profiler
itself costs time, so a profiled run's throughput is not a measurement.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

ENV = "HETBENCH_PROFILE"
#: What a part is when nothing profiles: one context manager, reused (nullcontext is).
_NOTHING = contextlib.nullcontext()


class LoopProfiler:
    """Profiles iterations [start, start + count) of one worker's loop, if asked for."""

    def __init__(self, run_dir: Path, rank: int, device: torch.device, start: int, count: int):
        self._run_dir, self._rank, self._device = run_dir, rank, device
        self._start, self._stop = start, start + count
        self._profile = None

    @classmethod
    def from_env(cls, run_dir: Path, rank: int, device: torch.device) -> LoopProfiler | None:
        spec = os.environ.get(ENV, "").strip()
        if not spec:
            return None
        try:
            start, count = (int(v) for v in spec.split(":"))
        except ValueError as exc:
            raise RuntimeError(f"{ENV}={spec!r}: expected START:COUNT iterations, e.g. "
                               "20:30") from exc
        return cls(run_dir, rank, device, start, count)

    def at_iteration(self, iteration: int) -> None:
        """Start or stop profiling at the loop's top."""
        if iteration == self._start and self._profile is None:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if self._device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._profile = profile(activities=activities)
            self._profile.__enter__()
        elif iteration == self._stop:
            self.close()

    def close(self) -> None:
        """Stop (if profiling) and write the table and the trace."""
        if self._profile is None:
            return
        profile, self._profile = self._profile, None
        profile.__exit__(None, None, None)
        sort = "cuda_time_total" if self._device.type == "cuda" else "cpu_time_total"
        table = profile.key_averages().table(sort_by=sort, row_limit=60)
        header = (f"rank {self._rank}, iterations {self._start}..{self._stop - 1}, "
                  f"{self._device}\n")
        (self._run_dir / f"profile.rank{self._rank}.txt").write_text(header + table)
        profile.export_chrome_trace(str(self._run_dir / f"profile.rank{self._rank}.json"))

    def part(self, name: str):
        """A labelled part of the loop while profiling, else nothing."""
        if self._profile is None:
            return _NOTHING
        return torch.profiler.record_function(f"hetbench/{name}")


def part(profiler: LoopProfiler | None, name: str):
    """`profiler.part(name)`, or a context that does nothing when the run is not profiled
    (the worker loop's five parts cost no allocation then)."""
    return _NOTHING if profiler is None else profiler.part(name)
