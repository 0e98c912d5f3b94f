"""prague-random: the ablation. Each requester draws a random group; no Group Division, no
threshold rule. Overlapping groups are not avoided, only queued in one global order (so they
cannot deadlock): a worker drawn by several requesters serializes their P-Reduces.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetbench.algorithms.prague.common import PragueOptions
from hetbench.algorithms.prague.smart import GeneratedGroups
from hetbench.core.options import opt


@dataclass(frozen=True, kw_only=True)
class PragueRandomOptions(PragueOptions):
    group_size: int = opt(4, "workers per random group")

    def __post_init__(self):
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2, got {self.group_size}")


class PragueRandom(GeneratedGroups):
    name = "prague-random"
    description = "Prague ablation: random groups per request, no conflict avoidance or threshold"
    Config = PragueRandomOptions

    @classmethod
    def generator_spec(cls, config, workers):
        return {"group_size": config.group_size, "delta_c": None, "group_division": False,
                "group_buffer": True}
