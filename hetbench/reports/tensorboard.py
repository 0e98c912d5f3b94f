"""`bench export tensorboard`: stored runs as TensorBoard event files, written after the fact.

One subdirectory per run, named by its run id, holding:

- test/loss, test/accuracy (and test/consensus_distance) at every evaluation of eval.jsonl;
- train/loss: the workers' mean training loss of each iteration;
- throughput/samples_per_s: samples of all workers per second in time bins over the run, and
  throughput/steady_state (the summary's, as the report gives it) once at the end;
- <phase>_share/worker_<r>: each worker's share of its step time in compute, slowdown, wait and
  comm, over chunks of its iterations;
- the config and summary as text, and the config as hparams (metrics: steady-state
  throughput, final test accuracy and loss) for TensorBoard's HParams dashboard.

The step of every scalar is an iteration (a mean over workers for evaluations, whose snapshots
are of every worker), and its wall time is when it happened: TensorBoard's "relative" axis then
plots the same curves against seconds since the start. Nothing here runs inside the timed loop:
everything is read from the run directory.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

from hetbench.core.record import read_run_json
from hetbench.core.rundir import RunDir
from hetbench.core.store import read_jsonl
from hetbench.errors import UserError
from hetbench.reports.waits import load_rank_events

PHASES = ("compute_s", "slowdown_s", "wait_s", "comm_s")
#: Points at most per curve built from events (throughput bins, time-share chunks).
MAX_POINTS = 200
METRICS = {"hparam/throughput": "throughput", "hparam/final_test_accuracy": "final_test_accuracy",
           "hparam/final_test_loss": "final_test_loss"}


def _writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise UserError("bench export tensorboard needs the tensorboard package: "
                        "pip install 'hetbench[tensorboard]' (or pip install tensorboard)"
                        ) from exc
    return SummaryWriter


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) else float(value)


def _start_s(events: dict[int, list[dict]], summary: dict[str, Any]) -> tuple[int, float]:
    """(t0 in ns on the events' clock, the same moment in Unix seconds).

    Real runs stamp events with time.time_ns(), so t0 is already Unix time; simulated runs count
    from 0, and are placed at the summary's started_at.
    """
    t0 = min(es[0]["t_start"] for es in events.values() if es)
    if t0 > 10**18:  # ns since 1970: after 2001
        return t0, t0 / 1e9
    try:
        return t0, datetime.fromisoformat(summary["started_at"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return t0, 0.0


def hparams_of(config: dict[str, Any]) -> dict[str, Any]:
    """The config's scalar values, options flattened as algorithm.<name> / workload.<name>."""
    params: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            prefix = key.removesuffix("_options")
            params.update({f"{prefix}.{k}": v for k, v in value.items()
                           if isinstance(v, str | int | float | bool)})
        elif isinstance(value, str | int | float | bool):
            params[key] = value
    return params


def export_run(run_dir: Path, out_dir: Path) -> Path:
    """Write one run's event files under out_dir/<run id>; returns that directory."""
    SummaryWriter = _writer_class()
    from torch.utils.tensorboard.summary import hparams

    config = read_run_json(RunDir(run_dir).config)
    summary_path = RunDir(run_dir).summary
    summary = read_run_json(summary_path) if summary_path.exists() else {"status": "incomplete"}
    events = load_rank_events(run_dir)
    evals, _ = read_jsonl(RunDir(run_dir).evaluations)
    target = out_dir / run_dir.name
    # A second export of the same run replaces the first instead of doubling its curves.
    for old in target.glob("events.out.tfevents.*"):
        old.unlink()
    writer = SummaryWriter(log_dir=str(target))
    try:
        writer.add_text("config", "    " + json.dumps(config, indent=2, sort_keys=True)
                        .replace("\n", "\n    "))
        writer.add_text("summary", "    " + json.dumps(summary, indent=2, sort_keys=True,
                                                       default=str).replace("\n", "\n    "))
        last_step, start_s, end_s = 0, 0.0, None
        if any(events.values()):
            t0, start_s = _start_s(events, summary)
            last_step, end_s = _train_scalars(writer, events, t0, start_s)
        for record in sorted(evals, key=lambda r: r.get("wall_s", 0.0)):
            step = round(_number(record.get("iteration")) or 0)
            wall = start_s + (_number(record.get("wall_s")) or 0.0)
            for key in ("test_loss", "test_accuracy", "consensus_distance"):
                value = _number(record.get(key))
                if value is not None:
                    writer.add_scalar(f"test/{key.removeprefix('test_')}", value, step, wall)
        metrics = {tag: v for tag, key in METRICS.items()
                   if (v := _number(summary.get(key))) is not None}
        if _number(summary.get("throughput")) is not None:
            writer.add_scalar("throughput/steady_state", summary["throughput"], last_step, end_s)
        experiment, session_start, session_end = hparams(hparams_of(config), metrics)
        for item in (experiment, session_start, session_end):
            writer.file_writer.add_summary(item)
        for tag, value in metrics.items():
            # The HParams dashboard reads each metric from a scalar of the same tag.
            writer.add_scalar(tag, value, last_step, end_s)
    finally:
        writer.close()
    return target


def _train_scalars(writer, events: dict[int, list[dict]], t0: int,
                   start_s: float) -> tuple[int, float]:
    """train/loss, throughput bins and time shares; returns the last iteration and when the
    last step ended (Unix seconds)."""

    def wall(t_ns: float) -> float:
        return start_s + (t_ns - t0) / 1e9

    by_iteration: dict[int, list[dict]] = {}
    for rank_events in events.values():
        for e in rank_events:
            by_iteration.setdefault(e["iteration"], []).append(e)
    for iteration in sorted(by_iteration):
        batch = by_iteration[iteration]
        losses = [v for e in batch if (v := _number(e.get("loss"))) is not None]
        if losses:
            writer.add_scalar("train/loss", sum(losses) / len(losses), iteration,
                              wall(sum(e["t_end"] for e in batch) / len(batch)))
    everything = sorted((e for es in events.values() for e in es), key=lambda e: e["t_end"])
    t_last = everything[-1]["t_end"]
    bins = max(1, min(MAX_POINTS, max(len(es) for es in events.values())))
    width = (t_last - t0) / bins
    done, samples, index = 0, 0, 0
    for b in range(bins):
        edge = t0 + (b + 1) * width
        samples = 0
        while index < len(everything) and (everything[index]["t_end"] <= edge or b == bins - 1):
            samples += everything[index].get("samples", 0)
            done = max(done, everything[index]["iteration"])
            index += 1
        if width > 0:
            writer.add_scalar("throughput/samples_per_s", samples / (width / 1e9), done,
                              wall(edge))
    for rank, rank_events in events.items():
        size = max(1, math.ceil(len(rank_events) / MAX_POINTS))
        for i in range(0, len(rank_events), size):
            chunk = rank_events[i:i + size]
            totals = {p: sum(max(e.get(p, 0.0) or 0.0, 0.0) for e in chunk) for p in PHASES}
            whole = sum(totals.values())
            if whole <= 0:
                continue
            for phase, seconds in totals.items():
                writer.add_scalar(f"{phase.removesuffix('_s')}_share/worker_{rank}",
                                  seconds / whole, chunk[-1]["iteration"],
                                  wall(chunk[-1]["t_end"]))
    return max(by_iteration), wall(t_last)


def export_tensorboard(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    """Export every run in `run_dirs` under out_dir; returns the directories written."""
    _writer_class()  # fail before writing anything when tensorboard is missing
    out_dir.mkdir(parents=True, exist_ok=True)
    return [export_run(run_dir, out_dir) for run_dir in run_dirs]
