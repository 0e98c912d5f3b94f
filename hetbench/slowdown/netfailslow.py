"""netfailslow:k=K;on=S;gap=G: transient fail-slow episodes on NICs, in cluster seconds.

Each worker's NIC alternates between healthy stretches (mean G seconds) and episodes (mean S
seconds) in which it has 1/K of its bandwidth; both lengths are exponential (memoryless, the
continuous form of failslow's geometric iterations), and a NIC starts in an episode with
probability S / (S + G), so it is slow a share S / (S + G) of the time at every moment. NICs
are independent, so at scale episodes overlap. Compute is untouched; the kind needs a
[network] table, whose cluster model divides the NIC's bandwidth by K (network/model.py).

Wu et al. (GREYHOUND, USENIX ATC'25, section 1; FALCON, arXiv:2410.12588), Alibaba, 10,000+
GPUs: communication fail-slows have a mean duration of 24 minutes (the default `on`, 1440 s)
and hit 40% of the paper's four-node probe jobs; the share of time a NIC spends in one is not a
number the paper gives, so the default gap keeps a NIC slow 2% of the time, as failslow's
compute episodes (gap = 49 x on). The bandwidth divisor within an episode (2) is hetbench's
choice. docs/stragglers.md says which numbers were checked.

A run of a minute sees an episode only if it starts in one (2% per NIC): set `on` and `gap` to
the run's scale (`netfailslow:k=4;on=5;gap=20`) to study what episodes do to an algorithm.
"""

from __future__ import annotations

import bisect

import numpy as np

from hetbench.errors import UserError
from hetbench.slowdown.blocks import Param, check_params
from hetbench.slowdown.network import NicOnly

#: Episodes drawn per NIC at a time: a NIC's schedule is the same prefix whatever horizon it
#: was drawn to.
_CHUNK = 64


class NetFailSlowSlowdown(NicOnly):
    kind = "netfailslow"
    syntax = "netfailslow:k=K;on=S;gap=G"
    description = ("NICs alternate healthy stretches (mean G cluster s) and fail-slow episodes "
                   "(mean S s, 1/K bandwidth), exponential lengths (FALCON; needs [network])")
    params = {
        "k": Param(2.0, 1.0, 100.0, "NIC bandwidth divisor within an episode"),
        "on": Param(1440.0, 1e-3, 1e9, "mean episode length (cluster seconds)"),
        "gap": Param(70560.0, 1e-3, 1e12, "mean healthy stretch (cluster seconds)"),
    }
    #: A word of the NICs' draws, apart from every other kind's of the same seed.
    salt = 31

    @classmethod
    def from_spec(cls, spec: str, args: str, seed: int) -> NetFailSlowSlowdown:
        values = {}
        for item in filter(None, (part.strip() for part in args.split(";"))):
            key, eq, value = item.partition("=")
            if not eq:
                raise UserError(f"slowdown {spec!r}: expected key=value, got {item!r}; write "
                                f"e.g. netfailslow:k=4;on=5;gap=20")
            values[key.strip()] = value.strip()
        return cls(spec, check_params(spec, cls.kind, cls.params, values), seed)

    def __init__(self, spec: str, values: dict[str, float], seed: int):
        self.spec = spec
        self.values = values
        self.seed = seed
        self.workers = 0
        #: Per NIC: the cluster second each stretch starts, and whether it is an episode.
        self._starts: dict[int, list[float]] = {}
        self._slow: dict[int, list[bool]] = {}
        self._rngs: dict[int, np.random.Generator] = {}

    def validate(self, workers: int) -> None:
        self.workers = workers

    def nic_factor(self, rank: int, t_s: float) -> float:
        if not 0 <= rank < self.workers:  # server ranks' NICs are not slowed
            return 1.0
        return self.values["k"] if self.in_episode(rank, t_s) else 1.0

    def in_episode(self, rank: int, t_s: float) -> bool:
        """Whether NIC `rank` is in a fail-slow episode at cluster second t_s (>= 0)."""
        starts = self._extend(rank, t_s)
        return self._slow[rank][bisect.bisect_right(starts, max(t_s, 0.0)) - 1]

    def _extend(self, rank: int, t_s: float) -> list[float]:
        """NIC `rank`'s stretches drawn at least past t_s."""
        on, gap = self.values["on"], self.values["gap"]
        if rank not in self._rngs:
            rng = np.random.default_rng([self.seed, rank, self.salt])
            self._rngs[rank] = rng
            self._starts[rank], self._slow[rank] = [0.0], [bool(rng.random() < on / (on + gap))]
        starts, slow, rng = self._starts[rank], self._slow[rank], self._rngs[rank]
        while starts[-1] <= t_s:  # the last stretch is open-ended: draw on, _CHUNK at a time
            for length in rng.exponential(1.0, _CHUNK):
                starts.append(starts[-1] + float(length) * (on if slow[-1] else gap))
                slow.append(not slow[-1])
        return starts
