"""preset:NAME: straggler models from the literature, each a composition of blocks
(slowdown/compose.py) with the source of every number. `bench list` shows them;
docs/stragglers.md says which numbers were checked against the papers and which were chosen.

OSDI'25 = Lin et al., "Understanding Stragglers in Large Model Training Using What-if
Analysis" (ByteDance, 3,079 jobs of 128+ GPUs). Its per-job loss to stragglers, as quoted in
hetbench's issue 36 (P50 7.8%, P90 21.3%, P99 45% of the step time), read as a share of the
step lost: slowdown 1 / (1 - loss) = 1.085, 1.271, 1.818. The slow share of workers is not given
there: 10% (at least one) is hetbench's choice.
"""

from __future__ import annotations

from hetbench.errors import UserError
from hetbench.slowdown.compose import ComposedSlowdown, parse_blocks

#: name -> (composition, where its numbers come from).
PRESETS: dict[str, tuple[str, str]] = {
    "osdi-p50": ("persistent(frac=0.1;k=1.085)",
                 "OSDI'25 median job: 7.8% of the step lost, steady over the job"),
    "osdi-p90": ("persistent(frac=0.1;k=1.271)", "OSDI'25 P90 job: 21.3% lost"),
    "osdi-p99": ("persistent(frac=0.1;k=1.818)", "OSDI'25 P99 job: 45% lost"),
    "seqlen": ("jitter(sigma=0.094)",
               "sequence-length imbalance, every worker every step (OSDI'25); log-sd fitted to "
               "the artifact's SE job"),
    "faulty": ("faulty(k=3;n=1)", "one faulty worker about 3x (OSDI'25, rare)"),
    "failslow": ("failslow(k=2;on=67;gap=3283)",
                 "FALCON/GREYHOUND (ATC'25) compute fail-slows: ~10 min episodes (67 steps of "
                 "9 s), 2% of the time; 2x chosen"),
    "gpuvar": ("gpuvar(spread=0.08;outlier_p=0.01;outlier_k=1.5)",
               "SC'22: 8% variation across GPUs of one SKU, outliers 1.5x (1% chosen)"),
    "gc": ("gc(every=50;pause=0.5)", "unsynchronized GC pauses (OSDI'25); period, length chosen"),
    "production": ("gpuvar(spread=0.08;outlier_p=0.01;outlier_k=1.5)+jitter(sigma=0.094)"
                   "+gc(every=50;pause=0.5)+persistent(frac=0.1;k=1.085)",
                   "all steady causes at once: gpuvar + seqlen + gc + osdi-p50"),
}


class PresetSlowdown(ComposedSlowdown):
    kind = "preset"
    syntax = "preset:NAME"
    description = "a straggler model from the literature: " + ", ".join(PRESETS)

    @classmethod
    def from_spec(cls, spec: str, args: str, seed: int) -> PresetSlowdown:
        if args not in PRESETS:
            raise UserError(f"slowdown {spec!r}: unknown preset {args!r}; presets: "
                            f"{', '.join(PRESETS)}")
        return cls(spec, parse_blocks(spec, PRESETS[args][0], seed))


def preset_lines() -> list[tuple[str, str]]:
    """(preset:NAME, composition and source) of every preset, for `bench list`."""
    return [(f"preset:{name}", f"{blocks}: {source}")
            for name, (blocks, source) in PRESETS.items()]
