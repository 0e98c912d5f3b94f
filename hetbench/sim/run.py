"""A simulated run: its directory (the real runs' schema) and its summary, around the engine
that plays it (sim/engine.py). `simulate(config, models, out_dir)` is the one entry point."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetbench.core.algorithm import Algorithm
from hetbench.core.config import RunConfig
from hetbench.core.record import summary_head
from hetbench.core.rundir import RunDir
from hetbench.core.signals import interrupted_cause
from hetbench.core.store import environment, read_json, write_json_atomic
from hetbench.errors import UserError
from hetbench.sim.engine import Engine
from hetbench.sim.model import SimModels
from hetbench.sim.sink import EventSink, full_events


@dataclass
class SimResult:
    """One simulated run: where it was written, its summary, and what simulating it cost."""

    config: RunConfig
    run_dir: Path
    summary: dict[str, Any]
    #: Wall seconds the simulation (and writing its files) took on this machine.
    sim_s: float


def simulate(config: RunConfig, models: SimModels, out_dir: Path,
             events: str = "auto", lockstep: bool = True, recorded_order=None) -> SimResult:
    """Simulate `config` and write its run directory `out_dir/<run_id>` (real runs' schema;
    `events`: one of sink.EVENT_MODES; `lockstep` False: event by event even where the protocol
    could be played an iteration at a time, for the tests that compare the two;
    `recorded_order`: a real run's order of events to follow, sim/recorded.py)."""
    started = time.time()
    run_dir = Path(out_dir) / config.run_id
    # An algorithm it cannot play fails here, before any file exists.
    engine = Engine(config, models, lockstep=lockstep, recorded_order=recorded_order)
    if config.learn:  # torch and torch.func: imported only by a run that learns
        from hetbench.sim.learn import Learner, check_learnable

        check_learnable(config, engine.protocol)
    _clear_previous(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if config.learn:
        engine.learner = Learner(config, run_dir)
    write_json_atomic(RunDir(run_dir).config, config.to_dict())
    write_json_atomic(RunDir(run_dir).env, {**environment(), "simulated": True})
    sink = engine.sink = EventSink(config, run_dir, full_events(events, config.workers),
                                   keep=facts_read_events(config))
    status, cause, stopped = "ok", None, None
    try:
        try:
            engine.run()
        except RuntimeError as exc:
            status, cause = "failed", f"simulator: {exc}"
        sink.close()
        if engine.learner is not None and status == "ok":
            # What the real workers' finish() does to the models after training (a drain).
            if engine.protocol.learn_finish is not None:
                engine.protocol.learn_finish(engine.learner, config.iterations)
            if not engine.protocol.learns_events:
                engine.learner.finish(engine.trained_until, config.iterations)
            else:  # workers' own iteration counts, as each real rank reports its own
                engine.learner.finish(engine.learner.last_end_s,
                                      sum(engine.iteration) / engine.n)
        summary = _summary(config, models, engine, status, cause, started)
    # Ctrl-C, SIGTERM, SIGHUP: on record, then stop bench. The outer try: a signal can also
    # land while the events are written and summed (seconds at 1024 workers).
    except KeyboardInterrupt as exc:
        stopped = exc
        sink.close()  # what was simulated so far, as a real run's events
        summary = _summary(config, models, engine, "interrupted", interrupted_cause(exc),
                           started)
    write_json_atomic(RunDir(run_dir).summary, summary)
    if stopped is not None:
        raise stopped
    return SimResult(config, run_dir, summary, summary["sim_s"])


#: Summary fields only a real run's host can measure: a simulated summary names them as absent.
#: (A staged message's speed, `staged_p2p_mb_per_s`, is not among them: a real run has it only
#: where ranks share a GPU, which no config says, so no simulated run could name it absent.)
REAL_ONLY = ("launcher", "backend", "devices", "fidelity", "network", "p2p_mb_per_iteration",
             "collective_mb_per_iteration", "clock_hosts", "machines",
             "clock_offset_ms", "clock_error_ms", "clock_drift_ms")
#: REAL_ONLY fields a real run has only sometimes: an emulated network's, and the clocks'
#: alignment (ranks on several hosts); a simulated summary names them absent only then.
SOMETIMES = {"fidelity": lambda config: bool(config.network),
             "network": lambda config: bool(config.network),
             **{key: lambda config: bool(config.hosts)
                for key in ("clock_offset_ms", "clock_error_ms", "clock_drift_ms")}}


def _summary(config: RunConfig, models: SimModels, engine: Engine, status: str,
             cause: str | None, started: float) -> dict[str, Any]:
    stats = engine.protocol.stats()
    summary = {
        **summary_head(config, status, cause, started),
        **engine.sink.summary(config),
        **(engine.learner.summary() if engine.learner is not None and status == "ok" else {}),
        **_facts(config, stats, engine.sink.kept_events()),
        "simulated": True, "sim": {**models.to_dict(config), **stats}, **config.code_record(),
        # A learned run trained its simulated workers on the workload's data; a timing-only
        # one trained on none.
        "data": (f"{config.data_source} (learned in the simulator)"
                 if engine.learner is not None else "none (simulated)"),
        # What a real summary of this config would hold that no simulation can measure.
        "absent": [key for key in REAL_ONLY
                   if key not in SOMETIMES or SOMETIMES[key](config)],
    }
    if config.timing:
        summary["timing"] = timing_summary(config, engine)
    # A simulated run has no start-up: its wall time is the simulated training span.
    summary["wall_s"] = summary["train_wall_s"]
    summary["sim_s"] = time.time() - started
    return summary


def timing_summary(config: RunConfig, engine: Engine) -> dict[str, Any]:
    """What a run with [timing] took from its timing workload, and what it did not."""
    timing = config.timing_config
    options = timing.workload_options
    return {
        "workload": timing.workload, "batch_size": options["batch_size"],
        "compute_preset": options.get("compute_preset") or None,
        "compute_ms": engine.compute_s * 1e3, "model_bytes": engine.layout.model_bytes,
        "meaning": (f"message sizes, compute time and samples per iteration are "
                    f"{timing.workload}'s; the model, data, accuracy, loss, iterations and "
                    f"consensus are those of {config.workload} (not a {timing.workload}'s "
                    "accuracy)"),
    }


def _facts(config: RunConfig, stats: dict[str, Any], events) -> dict[str, Any]:
    """The algorithm's summary_facts, as a real summary has them (facts_record: the values,
    and their names and units under "facts"): from every worker's events as the simulated
    run's lines hold them (the sink's kept events; written or not), with what the protocol
    counted (its stats) where it counted the same thing, None where a fact needs what only
    real ranks record (their done records)."""
    algorithm = config.algorithm_class()
    facts = algorithm.summary_facts(config.algorithm_config(), events,
                                    [None] * config.world_size)
    return algorithm.facts_record({key: stats.get(key, value) for key, value in facts.items()})


class _Probe(Sequence):
    """No events, and a note of whether anything looked at them (facts_read_events)."""

    def __init__(self):
        self.read = False

    def __len__(self) -> int:
        self.read = True
        return 0

    def __getitem__(self, index):
        self.read = True
        return [][index]

    def __iter__(self):
        self.read = True
        return iter(())


def facts_read_events(config: RunConfig) -> bool:
    """Whether config's algorithm's summary_facts reads the events it is given, so that the
    simulator must keep what rebuilds every event (EventSink.keep; at 1,024 workers x 1,000
    iterations a worker-by-worker lockstep path and about a hundred bytes per event).

    Found by calling it on no events that note being looked at, with the config and done
    records the simulated run's call gets: a summary_facts that does not look at them there
    follows the same path at the end of the run (nothing it branches on differs), so it never
    needs them. One not overridden (Algorithm's: nothing) is not called; one that fails on no
    events is taken to read them."""
    algorithm = config.algorithm_class()
    if getattr(algorithm.summary_facts, "__func__", None) is Algorithm.summary_facts.__func__:
        return False
    probe = _Probe()
    try:
        algorithm.summary_facts(config.algorithm_config(), probe, [None] * config.world_size)
    except Exception:
        return True
    return probe.read


def _clear_previous(run_dir: Path) -> None:
    """Remove an earlier simulation of the same run; never touch a real run's directory."""
    if not run_dir.exists():
        return
    # env.json marks a simulation from its start: one killed before its summary is ours too.
    try:
        simulated = read_json(RunDir(run_dir).env).get("simulated") is True
    except (OSError, ValueError):
        simulated = False
    if not simulated:
        raise UserError(f"{run_dir} holds a real (or unfinished) run; simulate into another "
                        "directory with --out")
    shutil.rmtree(run_dir)

