"""The work of one iteration as an algorithm that owns its compute sees it (Algorithm.compute).

The harness implements it (harness/work.py) for real runs; the simulated and learning halves
take the same decisions through the same pure functions (split_batch, and an algorithm's own
rule over the per-micro-batch durations the harness would have measured).
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class Work(ABC):
    """This iteration's forward and backward, handed out a micro-batch at a time."""

    #: The workload's batch size: what one iteration computes by default.
    batch_size: int

    @abstractmethod
    def compute(self, samples: int | None = None) -> None:
        """Forward and backward over the next `samples` samples of this worker's stream (the
        batch size by default): one micro-batch, its gradient added to what this iteration
        computed so far. The pace floor and the injected slowdown apply to it in proportion to
        its samples. Its time is read from `elapsed_s`: on a GPU the micro-batch may still be
        queued when this returns, and only reading the clock waits for it."""

    @abstractmethod
    def skip(self, samples: int) -> None:
        """Drop the next `samples` samples of the stream uncomputed (DropCompute's dropped
        micro-batches): the next compute starts after them."""

    @property
    @abstractmethod
    def elapsed_s(self) -> float:
        """Seconds of this iteration's compute so far, floor and slowdown included, in the
        run's time (cluster seconds under a network model): what a worker's own clock says.
        On a GPU, reading it waits for the micro-batches queued so far (the stream drains
        there), so an algorithm reads it only where a decision needs it."""

    @property
    @abstractmethod
    def samples(self) -> int:
        """Samples computed so far this iteration."""

    @property
    @abstractmethod
    def micro_batches(self) -> int:
        """Micro-batches computed so far this iteration."""


def split_batch(batch_size: int, micro_batches: int) -> list[int]:
    """`batch_size` samples in `micro_batches` micro-batches as even as they go (the first
    ones one larger where it does not divide): the sizes real, simulated and learned runs use
    alike."""
    if not 1 <= micro_batches <= batch_size:
        raise ValueError(f"cannot split a batch of {batch_size} into {micro_batches} "
                         "micro-batches")
    base, extra = divmod(batch_size, micro_batches)
    return [base + 1] * extra + [base] * (micro_batches - extra)
