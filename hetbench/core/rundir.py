"""A run directory's files by name: the one place that spells them (core/record.py says what
each holds, and who writes it)."""

from __future__ import annotations

from pathlib import Path

EVENTS_PREFIX = "events.rank"


class RunDir:
    """The paths of one run's files. Cheap to make: it only joins names to `path`."""

    __slots__ = ("path",)

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def config(self) -> Path:
        """config.json: the RunConfig, written first (its presence marks a run directory)."""
        return self.path / "config.json"

    @property
    def env(self) -> Path:
        """env.json: the machine and the code that ran it."""
        return self.path / "env.json"

    @property
    def summary(self) -> Path:
        """summary.json: written last, whatever happened (status ok or failed, with cause)."""
        return self.path / "summary.json"

    @property
    def evaluations(self) -> Path:
        """eval.jsonl: the evaluations of the model (accuracy curves, the target's crossing)."""
        return self.path / "eval.jsonl"

    @property
    def workers(self) -> Path:
        """workers.json: a simulated run's per-worker totals, where it keeps no event lines."""
        return self.path / "workers.json"

    def events(self, rank: int) -> Path:
        """events.rank<r>.jsonl: rank r's line per iteration."""
        return self.path / f"{EVENTS_PREFIX}{rank}.jsonl"

    def done(self, rank: int) -> Path:
        """done.rank<r>.json: rank r ended cleanly (what its finish() did)."""
        return self.path / f"done.rank{rank}.json"

    def error(self, rank: int) -> Path:
        """error.rank<r>.json: why rank r failed."""
        return self.path / f"error.rank{rank}.json"

    def worker_log(self, rank: int) -> Path:
        """worker.rank<r>.log: rank r's stdout and stderr."""
        return self.path / f"worker.rank{rank}.log"

    def event_logs(self) -> list[tuple[int, Path]]:
        """(rank, path) of every events.rank<r>.jsonl present, in rank order."""
        found = []
        for path in self.path.glob(f"{EVENTS_PREFIX}*.jsonl"):
            rank = path.name.removeprefix(EVENTS_PREFIX).split(".")[0]
            if rank.isdigit():
                found.append((int(rank), path))
        return sorted(found)
