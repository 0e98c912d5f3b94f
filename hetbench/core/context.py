"""What a worker knows about its place in the run; handed to algorithms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from hetbench.comm.comm import Comm


@dataclass
class WorkerContext:
    """A rank's view of the run. Workers are ranks 0..workers-1; server ranks (if any) follow."""

    rank: int
    world_size: int
    workers: int
    device: torch.device
    comm: Comm
    seed: int
    #: Seeded per rank: the only randomness an algorithm should use (peer choice, say).
    rng: np.random.Generator
    #: What the algorithm's services() yielded in the launcher (addresses of helper processes).
    services: dict = field(default_factory=dict)
    #: Always False: kept so that release 0.1's first plugins, which read it, still load.
    #: An algorithm learns that training is over when the harness calls its finish().
    stopping: bool = False
    #: Ends this iteration's compute (pace floor, injected slowdown); the harness calls it
    #: after backward. An algorithm that communicates inside backward (a DDP hook) calls it
    #: first, before that communication starts, so waiting is never timed as compute.
    end_compute: Callable[[], None] = lambda: None
    #: A server rank's serve() calls it after each update of its model, once the update's
    #: replies are on their way (its cost then overlaps the workers' next compute). Where the
    #: algorithm evaluates the server's model (Algorithm.evaluated_model = "server"), the
    #: harness sets it before serve() to keep that model: at the snapshot ticks (a clock read
    #: per call), and with a target after every update (a copy of the model). A no-op
    #: elsewhere.
    model_updated: Callable[[], None] = lambda: None
    extra: dict = field(default_factory=dict)
    #: Host seconds per second of the run's time (an emulated network's dilation, else 1): a
    #: duration an algorithm measures with its own clock, divided by it, is the run's.
    dilation: float = 1.0

    @property
    def is_worker(self) -> bool:
        return self.rank < self.workers

    @property
    def worker_ranks(self) -> list[int]:
        return list(range(self.workers))
