"""What a run's summary.json measures, real or simulated: one builder (summary_body) owns its
keys and the arithmetic both kinds share, fed a SummaryInputs that each kind fills from its own
source: a real run from the event files it read (core.record.summarize), a simulated one from
the compact per-worker arrays it kept (sim.sink.EventSink.summary), which at thousands of
workers never become one dict per event. A field added here reaches both kinds at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hetbench.core.config import RunConfig
from hetbench.core.metrics import throughput_of_columns
from hetbench.core.waits import declared_wait_rule, wait_rule_name


@dataclass(frozen=True)
class SummaryInputs:
    """What summary_body reads. The columns are per worker, in rank order, one entry per step
    in the order the worker took them; the parts a kind sums its own way come summed. What only
    a real run's ranks and files record defaults to what a simulated run says of it."""

    #: Each step's start and end (ns, one clock) and the samples it counted (0 when dropped).
    starts: Sequence[Sequence[int]]
    ends: Sequence[Sequence[int]]
    samples: Sequence[Sequence[int]]
    #: Each worker's last iteration (None before its first).
    last_iterations: Sequence[int | None]
    #: sync_share, mean_group_size, mean_staleness (metrics.SyncTally.health).
    sync: dict[str, float | None]
    #: Total compute_s, slowdown_s, comm_s and wait_s.
    times: dict[str, float]
    #: Steps whose gradient the protocol threw away (StepInfo.discarded): no throughput.
    gradients_dropped: int
    #: eval.jsonl's records: the final evaluation and the consensus snapshots.
    evaluations: Sequence[dict[str, Any]] = ()
    averagings_after_training: int | None = None
    #: The algorithm's summary_facts as facts_record writes them (a simulated run adds its
    #: own after its learning, sim/run.py).
    facts: dict[str, Any] = field(default_factory=dict)
    #: Event lines that could not be read whole.
    torn_lines: int = 0
    train_cpu_s: float | None = None
    #: What the ranks' hosts recorded: emulated network fidelity, transport, traffic, clocks.
    host: dict[str, Any] = field(default_factory=dict)
    #: How a simulated run kept its events (full: lines; workers: workers.json); None: real.
    events: str | None = None


def summary_body(config: RunConfig, inputs: SummaryInputs) -> dict[str, Any]:
    """Throughput, iterations, time breakdown and synchronization of a run, and what its
    evaluations, algorithm and hosts say: summary.json less its head (record.summary_head)."""
    # A worker's steps run one after another, so its first starts first; a step may end after
    # a later one's start is logged, so the last end is sought.
    firsts = [s[0] for s in inputs.starts if len(s)]
    lasts = [max(e) for e in inputs.ends if len(e)]
    evals = inputs.evaluations
    final = next((e for e in reversed(evals) if e.get("kind") == "final"), {})
    snapshots = [e["consensus_distance"] for e in evals
                 if e.get("kind") == "snapshot" and e.get("consensus_distance") is not None]
    counts = [len(s) for s in inputs.starts]
    return {
        "throughput": throughput_of_columns(inputs.starts, inputs.ends, inputs.samples,
                                            config.warmup_iterations),
        "samples": sum(sum(s) for s in inputs.samples),
        "iterations": sum(counts),
        "iterations_per_worker": counts,
        "last_iteration_per_worker": list(inputs.last_iterations),
        "train_wall_s": (max(lasts) - min(firsts)) / 1e9 if firsts else 0.0,
        "final_test_loss": final.get("test_loss"),
        "final_test_accuracy": final.get("test_accuracy"),
        # Language models (the transformer workload): exp of the test loss.
        **({"final_test_perplexity": final["test_perplexity"]}
           if "test_perplexity" in final else {}),
        "final_consensus_distance": final.get("consensus_distance"),
        "mean_consensus_distance": sum(snapshots) / len(snapshots) if snapshots else None,
        **algorithm_record(config),
        **inputs.sync,
        "averagings_after_training": inputs.averagings_after_training,
        "gradients_dropped": inputs.gradients_dropped,
        **inputs.facts,
        "torn_lines": inputs.torn_lines,
        **inputs.times,
        "train_cpu_s": inputs.train_cpu_s,
        **inputs.host,
        **({"events": inputs.events} if inputs.events is not None else {}),
    }


def algorithm_record(config: RunConfig) -> dict[str, Any]:
    """What every summary says of the run's algorithm, real or simulated: the model it
    evaluates, the rule its waits follow, and the share of time it intends to synchronize."""
    algorithm, options = config.algorithm_class(), config.algorithm_config()
    return {
        "evaluated_model": algorithm.evaluated_model_name(),
        "wait_rule": wait_rule_name(declared_wait_rule(algorithm, options, config.workers)),
        "sync_intended": algorithm.intended_sync_share(options, config.workers),
    }
