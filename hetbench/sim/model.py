"""The simulator's cost models: compute time per iteration, and alpha + bytes/beta per message."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from hetbench.errors import UserError
from hetbench.harness.config import RunConfig

#: Bytes per model element (float32, as every built-in workload trains in).
ELEMENT_BYTES = 4


@dataclass(frozen=True)
class NetworkModel:
    """Every message costs alpha + bytes/beta; links are independent (no shared switch)."""

    #: Latency per message, seconds.
    alpha_s: float = 20e-6
    #: Bandwidth per link, bytes per second.
    beta_bytes_per_s: float = 10e9 / 8
    #: Seconds to build a P-Reduce member communicator (a member-set cache miss).
    group_setup_s: float = 0.0

    def __post_init__(self):
        if self.alpha_s < 0 or not math.isfinite(self.alpha_s):
            raise UserError(f"network latency must be >= 0, got {self.alpha_s * 1e6:g} us")
        if self.beta_bytes_per_s <= 0 or not math.isfinite(self.beta_bytes_per_s):
            raise UserError("network bandwidth must be > 0 Gbit/s")
        if self.group_setup_s < 0:
            raise UserError(f"group set-up time must be >= 0, got {self.group_setup_s:g} s")

    def message(self, nbytes: float) -> float:
        """One point-to-point message."""
        return self.alpha_s + nbytes / self.beta_bytes_per_s

    def ring_allreduce(self, nbytes: float, n: int) -> float:
        """Ring all-reduce of nbytes over n ranks: 2(n-1)/n * bytes/beta + 2(n-1) alpha."""
        if n < 2:
            return 0.0
        return 2 * (n - 1) / n * nbytes / self.beta_bytes_per_s + 2 * (n - 1) * self.alpha_s

    def p_reduce(self, nbytes: float, members: int) -> float:
        """P-Reduce over a group: the ring all-reduce formula over its members (0 alone)."""
        return self.ring_allreduce(nbytes, members)


@dataclass(frozen=True)
class Layout:
    """What a workload's messages weigh: the model's element count and its all-reduce buckets."""

    numel: int
    bucket_bytes: tuple[int, ...]

    @property
    def model_bytes(self) -> int:
        return self.numel * ELEMENT_BYTES


def layout(config: RunConfig) -> Layout:
    """The real model's size and All-Reduce buckets (the model is built once per workload)."""
    bucket_mb = config.algorithm_options.get("bucket_mb", 25.0)
    return _layout(config.workload, json.dumps(config.workload_options, sort_keys=True),
                   config.seed, float(bucket_mb))


@lru_cache(maxsize=32)
def _layout(workload: str, options_json: str, seed: int, bucket_mb: float) -> Layout:
    from hetbench.harness.options import build_config
    from hetbench.harness.tensors import buckets, params_of
    from hetbench.workloads import WORKLOADS

    cls = WORKLOADS.get(workload)
    model = cls(build_config(cls.Config, json.loads(options_json), workload), seed).build_model()
    params = params_of(model)
    groups = buckets(params, int(bucket_mb * 2**20))
    sizes = tuple(sum(p.numel() for p in group) * ELEMENT_BYTES for group in groups if group)
    return Layout(sum(p.numel() for p in params), sizes)


@dataclass(frozen=True)
class ComputeModel:
    """Seconds of compute per iteration: a constant, or fitted per workload from real runs.

    Fitted, each iteration's compute is drawn (seeded, per worker) from the real runs' unslowed
    iterations, so their jitter reaches the simulated waits: a synchronous step waits for the
    slowest of n draws, not for the median. The pacing floor applies on top, as in a real run:
    compute = max(model's time, pace_ms).
    """

    #: A constant for every workload (seconds), overriding the rest.
    constant_s: float | None = None
    #: Fitted from real runs: (workload, pace_ms) -> sorted unslowed compute seconds.
    fitted: dict[tuple[str, float], tuple[float, ...]] = field(default_factory=dict)
    #: Where `fitted` came from (for error messages and the summary).
    fitted_from: str | None = None

    def __post_init__(self):
        if self.constant_s is not None and not self.constant_s >= 0:
            raise UserError(f"compute time must be >= 0 ms, got {self.constant_s * 1e3:g}")

    def seconds(self, config: RunConfig) -> float:
        """Compute seconds of one unslowed iteration of `config` (the median, when fitted)."""
        samples = self._samples(config)
        if samples is not None:
            return max(statistics.median(samples), config.pace_ms / 1000)
        return self._constant(config)

    def sampler(self, config: RunConfig) -> Callable[[int], float] | None:
        """draw(worker) -> one iteration's compute seconds, or None when compute is constant."""
        samples = self._samples(config)
        if samples is None:
            return None
        import numpy as np

        pace = config.pace_ms / 1000
        values = np.maximum(np.asarray(samples), pace).tolist()
        rngs = [np.random.default_rng([config.seed, w, 23]) for w in range(config.workers)]
        count = len(values)

        def draw(worker: int) -> float:
            return values[int(rngs[worker].integers(count))]

        return draw

    def _samples(self, config: RunConfig) -> tuple[float, ...] | None:
        if self.constant_s is not None or self.fitted_from is None:
            return None
        key = (config.workload, float(config.pace_ms))
        if key not in self.fitted:
            have = ", ".join(f"{w} (pace {p:g} ms)" for w, p in sorted(self.fitted)) or "none"
            raise UserError(
                f"--fit-from {self.fitted_from}: no real run of {config.workload} with "
                f"pace_ms {config.pace_ms:g} to fit compute from (fitted: {have}); "
                "pass --compute-ms instead")
        return self.fitted[key]

    def _constant(self, config: RunConfig) -> float:
        pace = config.pace_ms / 1000
        if self.constant_s is not None:
            return max(self.constant_s, pace)
        if config.compute == "emulated":
            return max(config.workload_options["compute_ms"] / 1000, pace)
        if pace > 0:
            return pace
        raise UserError(
            f"no compute time for {config.workload}: pass --compute-ms MS, --pace-ms MS or "
            "--fit-from RESULTS_DIR (real runs of the workload)")

    def describe(self, config: RunConfig) -> str:
        if self.constant_s is not None:
            return "constant (--compute-ms)"
        if self.fitted_from is not None:
            return f"drawn from unslowed real iterations in {self.fitted_from}"
        return "emulated compute_ms" if config.compute == "emulated" else "pace_ms"


@dataclass(frozen=True)
class SimModels:
    """Everything the simulator assumes about the machines it plays."""

    network: NetworkModel = NetworkModel()
    compute: ComputeModel = ComputeModel()

    def to_dict(self, config: RunConfig) -> dict[str, Any]:
        """The assumptions of one simulated run, for its summary.json."""
        return {
            "alpha_us": self.network.alpha_s * 1e6,
            "beta_gbps": self.network.beta_bytes_per_s * 8 / 1e9,
            "group_setup_ms": self.network.group_setup_s * 1e3,
            "compute_ms": self.compute.seconds(config) * 1e3,
            "compute_model": self.compute.describe(config),
            "model_bytes": layout(config).model_bytes,
        }


def fit_compute(results_dir: Path) -> ComputeModel:
    """Compute times of unslowed, post-warm-up iterations of real runs, per (workload, pace).

    A real iteration's compute is compute_s plus the part of slowdown_s that was not injected
    (the sleep overshoot), so an iteration counts only where the run's injector, rebuilt from
    its config, says the factor was 1; that time is compute_s + slowdown_s.
    """
    from hetbench.harness.store import read_json, read_jsonl
    from hetbench.reports.load import run_dirs
    from hetbench.slowdown import parse_slowdown

    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise UserError(f"--fit-from {results_dir}: no such directory")
    samples: dict[tuple[str, float], list[float]] = {}
    for run_dir in run_dirs(results_dir):
        try:
            config = read_json(run_dir / "config.json")
            summary = read_json(run_dir / "summary.json")
        except (OSError, ValueError):
            continue
        if summary.get("status") != "ok" or summary.get("simulated"):
            continue
        try:
            injector = parse_slowdown(config["slowdown"], seed=config["seed"])
            injector.validate(config["workers"])
        except UserError:
            continue  # a trace file that moved: the slowed iterations cannot be told apart
        key = (config["workload"], float(config.get("pace_ms", 0.0)))
        warmup = config.get("warmup_iterations", 0)
        for rank in range(config["workers"]):
            events, _ = read_jsonl(run_dir / f"events.rank{rank}.jsonl")
            if not events:
                continue
            t0 = events[0]["t_start"]
            for e in events[warmup:]:
                if injector.factor(rank, e["iteration"], (e["t_start"] - t0) / 1e9) == 1.0:
                    samples.setdefault(key, []).append(e["compute_s"] + e["slowdown_s"])
    if not samples:
        raise UserError(f"--fit-from {results_dir}: no finished real runs with events there")
    return ComputeModel(fitted={k: tuple(sorted(v)) for k, v in samples.items()},
                        fitted_from=str(results_dir))


def fit_alpha(results_dir: Path, beta_bytes_per_s: float) -> float | None:
    """Per-message latency that makes the ring all-reduce formula match real allreduce runs.

    From every finished real allreduce run without slowdown under `results_dir`: the median
    post-warm-up comm_s (real allreduce counts waiting for a late peer as communication, so
    only unslowed runs and the median are used), less the bandwidth term, over the formula's
    2(n-1) latencies per bucket. The median over runs; None if there is no such run.
    """
    from hetbench.harness.store import read_json, read_jsonl
    from hetbench.reports.load import run_dirs

    estimates = []
    for run_dir in run_dirs(Path(results_dir)):
        try:
            raw = read_json(run_dir / "config.json")
            summary = read_json(run_dir / "summary.json")
        except (OSError, ValueError):
            continue
        if (raw.get("algorithm") != "allreduce" or raw.get("slowdown") != "none"
                or summary.get("status") != "ok" or summary.get("simulated")):
            continue
        config = RunConfig.from_dict(raw)
        n = config.workers
        comm = [e["comm_s"] for r in range(n)
                for e in read_jsonl(run_dir / f"events.rank{r}.jsonl")[0]
                [config.warmup_iterations:]]
        if not comm:
            continue
        buckets = layout(config).bucket_bytes
        bandwidth = sum(2 * (n - 1) / n * b / beta_bytes_per_s for b in buckets)
        estimates.append(max(statistics.median(comm) - bandwidth, 0.0)
                         / (2 * (n - 1) * len(buckets)))
    return statistics.median(estimates) if estimates else None
