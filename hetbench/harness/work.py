"""The Work an algorithm that owns its compute takes its micro-batches from (Algorithm.compute).

Each micro-batch is forward and backward over the next samples of the worker's stream, its loss
scaled by its share of a batch so that the gradients add up to a batch's; compute_end.py pads
it to its share of the pace floor and sleeps its share of the slowdown. When the algorithm is
done, the gradient is rescaled to the mean over the samples it used, and the iteration's
compute ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from hetbench.comm.clock import now_ns
from hetbench.core.work import Work
from hetbench.harness.compute_end import ComputeEnd


class SampleStream:
    """A worker's minibatches as a stream of samples: take or skip any number, across the
    workload's batches."""

    def __init__(self, batches: Iterator):
        self._batches = batches
        self._x = self._y = None
        self._at = 0

    def _pieces(self, samples: int):
        while samples > 0:
            if self._x is None or self._at == len(self._x):
                self._x, self._y = next(self._batches)
                self._at = 0
            count = min(samples, len(self._x) - self._at)
            yield self._x[self._at:self._at + count], self._y[self._at:self._at + count]
            self._at += count
            samples -= count

    def take(self, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        pieces = list(self._pieces(samples))
        if len(pieces) == 1:
            return pieces[0]
        return torch.cat([x for x, _ in pieces]), torch.cat([y for _, y in pieces])

    def skip(self, samples: int) -> None:
        for _ in self._pieces(samples):
            pass


class HarnessWork(Work):
    """One worker's Work, reused every iteration (begin, the algorithm's calls, finish)."""

    def __init__(self, workload, net, model, stream: SampleStream | None,
                 end_compute: ComputeEnd, batch_size: int, device: torch.device,
                 dilation: float, emulated_wait: Callable[[float], None] | None = None,
                 emulated_s: float = 0.0):
        self.batch_size = batch_size
        self._workload, self._net, self._model, self._stream = workload, net, model, stream
        self._end_compute, self._device, self._dilation = end_compute, device, dilation
        #: Under emulated compute (no stream): the wait a whole batch's compute lasts.
        self._emulated_wait, self._emulated_s = emulated_wait, emulated_s
        self.begin()

    def begin(self) -> None:
        self._started_ns = now_ns()
        self._samples = self._micro_batches = 0
        self._loss_sum: torch.Tensor | None = None

    def compute(self, samples: int | None = None) -> None:
        count = self.batch_size if samples is None else int(samples)
        if count < 1:
            raise ValueError(f"a micro-batch of {samples} samples: compute at least one")
        share = count / self.batch_size
        begun = self._end_compute.micro_batch_begin()
        if self._stream is None:
            self._emulated_wait(self._emulated_s * share)
        else:
            x, y = self._stream.take(count)
            loss = self._workload.loss(self._net, (x.to(self._device), y.to(self._device)))
            # Scaled by its share, the micro-batches' gradients add up to a batch's mean.
            (loss * share if share != 1.0 else loss).backward()
            weighted = loss.detach() * count
            self._loss_sum = weighted if self._loss_sum is None else self._loss_sum + weighted
        self._end_compute.micro_batch(begun, share)
        self._samples += count
        self._micro_batches += 1

    def skip(self, samples: int) -> None:
        if samples > 0 and self._stream is not None:
            self._stream.skip(int(samples))

    @property
    def elapsed_s(self) -> float:
        self._end_compute.wait_micro_batches()  # on CUDA, what was queued has run
        return (now_ns() - self._started_ns) / 1e9 / self._dilation

    @property
    def samples(self) -> int:
        return self._samples

    @property
    def micro_batches(self) -> int:
        return self._micro_batches

    @torch.no_grad()
    def finish(self) -> torch.Tensor | None:
        """The algorithm's compute is over: end the iteration's compute, leave the mean
        gradient over the samples used in p.grad; returns the mean loss (None when nothing was
        computed, or under emulated compute)."""
        self._end_compute.end_micro_batches()
        if self._stream is None:
            return None
        if self._samples == 0:  # nothing computed: a zero gradient, not the last one's
            for p in self._model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
            return None
        if self._samples != self.batch_size:
            scale = self.batch_size / self._samples
            for p in self._model.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        return self._loss_sum / self._samples
