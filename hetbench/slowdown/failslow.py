"""failslow(k=K;on=D;gap=G): transient fail-slow episodes. Each worker alternates between
healthy stretches (mean G iterations) and episodes (mean D iterations) in which it is K times
slower; both lengths are geometric (memoryless), and each worker starts in an episode with
probability D / (D + G), so a worker is slow a share D / (D + G) of the time at every
iteration. Workers are independent, so at scale episodes overlap.

Wu et al. (FALCON, arXiv:2410.12588; GREYHOUND, USENIX ATC'25), Alibaba, 10,000+ GPUs:
fail-slows are transient; computation episodes last about 10 minutes on average and are rare
(under 2% of the time), network ones about 24 minutes. hetbench counts in iterations: at the
SE job's ~9 s steps (slowdown/traces/README.md), 10 minutes is about 67 iterations. The
slowdown within an episode is hetbench's choice (2x); see docs/stragglers.md.
"""

from __future__ import annotations

import numpy as np

from hetbench.slowdown.blocks import Block, Param

#: Episode lengths drawn per worker at a time: a worker's schedule is the same prefix
#: whatever horizon it was drawn to.
_CHUNK = 64


class FailSlowBlock(Block):
    name = "failslow"
    salt = 4
    params = {
        "k": Param(2.0, 1.0, 100.0, "slowdown factor within an episode"),
        "on": Param(67, 1, 1e9, "mean episode length (iterations)"),
        "gap": Param(3283, 1, 1e12, "mean healthy stretch between episodes (iterations)"),
    }

    def validate(self, workers: int) -> None:
        super().validate(workers)
        self.slow = np.zeros((workers, 0), dtype=bool)

    def column(self, workers: np.ndarray, iteration: int) -> np.ndarray:
        if iteration >= self.slow.shape[1]:
            self.slow = self._schedule(max(2 * iteration + 1, 1024))
        return np.where(self.slow[workers % self.slow.shape[0], iteration], self.values["k"], 1.0)

    def _schedule(self, horizon: int) -> np.ndarray:
        """slow[w, i]: whether worker w is in an episode at iteration i < horizon."""
        on, gap = self.values["on"], self.values["gap"]
        slow = np.zeros((self.workers, horizon), dtype=bool)
        for worker in range(self.workers):
            rng = np.random.default_rng([self.seed, worker, self.stream])
            in_episode = rng.random() < on / (on + gap)
            start = 0
            while start < horizon:
                # Alternate episode and healthy lengths, _CHUNK pairs per draw.
                episodes = rng.geometric(1.0 / on, _CHUNK)
                healthy = rng.geometric(1.0 / gap, _CHUNK)
                for episode, rest in zip(episodes, healthy, strict=True):
                    first, second = (episode, rest) if in_episode else (rest, episode)
                    if in_episode:
                        slow[worker, start:start + first] = True
                    else:
                        slow[worker, start + first:start + first + second] = True
                    start += first + second
                    if start >= horizon:
                        break
        return slow
