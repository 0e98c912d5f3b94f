"""preset:NAME: straggler models from the literature, each a composition of blocks
(slowdown/compose.py) with the source of every number. `bench list` shows them;
docs/stragglers.md says which numbers were checked against the papers and which were chosen.

OSDI'25 = Lin et al., "Understanding Stragglers in Large Model Training Using What-if
Analysis" (ByteDance, 3,079 jobs of 128+ GPUs). Its per-job waste of GPU-hours to stragglers,
(T - T_ideal) / T = 1 - 1/S (section 3.3, Eq. 3): P90 21.3% and P99 45.0% (section 4.1, Fig.
3), so slowdowns S = 1 / (1 - waste) = 1.271 and 1.818; the median, 7.8% (S = 1.085), is read
off Fig. 3's curve, not stated in the text. The slow share of workers is not given there: 10%
(at least one) is hetbench's choice.
"""

from __future__ import annotations

from hetbench.errors import UserError
from hetbench.slowdown.compose import ComposedSlowdown, parse_blocks

#: name -> (composition, where its numbers come from).
PRESETS: dict[str, tuple[str, str]] = {
    "osdi-p50": ("persistent(frac=0.1;k=1.085)",
                 "OSDI'25 median job: ~7.8% of GPU-hours wasted (read off Fig. 3), steady over "
                 "the job"),
    "osdi-p90": ("persistent(frac=0.1;k=1.271)", "OSDI'25 P90 job: 21.3% wasted (sec. 4.1)"),
    "osdi-p99": ("persistent(frac=0.1;k=1.818)", "OSDI'25 P99 job: 45.0% wasted (sec. 4.1)"),
    "seqlen": ("jitter(sigma=0.094)",
               "sequence-length imbalance, every worker every step (OSDI'25); log-sd fitted to "
               "the artifact's SE job"),
    "faulty": ("faulty(k=3;n=1)",
               "OSDI'25 sec. 5.1: in 1.7% of straggling jobs the slowest 3% of workers cause "
               "over half the slowdown, and those jobs are 3.04x slow; one worker 3x slower "
               "gives a synchronous job that slowdown (n=1 chosen)"),
    "failslow": ("failslow(k=2;on=67;gap=3283)",
                 "GREYHOUND (ATC'25) compute fail-slows: 10 min mean episodes (67 steps of "
                 "9 s); slow 2% of the time and 2x chosen (the paper: <2% of single-node "
                 "probe jobs had one)"),
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
