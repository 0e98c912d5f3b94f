"""Per-worker timeline (Gantt-style PNG) of one run: compute, slowdown, communication, waiting."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from hetbench.core.metrics import throughput_window
from hetbench.core.rundir import RunDir
from hetbench.errors import UserError
from hetbench.reports.plots import new_figure
from hetbench.reports.waits import load_rank_events, run_waits, with_inferred_waits

#: Drawn in this order inside each iteration: the harness times the phases in this order, except
#: that it cannot tell where inside a step the waiting fell, so waiting is drawn before comm.
PHASES = [("compute_s", "compute", "#4c72b0"), ("slowdown_s", "injected slowdown", "#c44e52"),
          ("wait_s", "waiting for peers", "#dd8452"), ("comm_s", "communication", "#55a868")]


def has_event_lines(run_dir) -> bool:
    """Whether a run directory holds any event line (its ranks' logs)."""
    return any(path.stat().st_size > 0 for path in Path(run_dir).glob("events*.jsonl"))


def choose_run(runs: pd.DataFrame, baseline: str = "allreduce",
               wanted: str | None = None) -> pd.Series | None:
    """The run to draw: `wanted` (a run id or a unique prefix), else the straggler showcase.

    The default is the baseline's ok run with the most injected slowdown (everyone waits for the
    straggler there), else any ok run with the most slowdown; only runs with event lines (not
    a big simulation that kept one record per worker, `bench sim --events workers`, nor a run
    stored without its lines). None when no ok run has them.
    """
    ok = runs[runs["status"] == "ok"]
    kept = pd.Series(True, index=ok.index)
    if "events" in ok:
        kept &= ok["events"].fillna("full") != "workers"
    if "run_dir" in ok:  # and whose lines are on disk (a study may be stored without them)
        kept &= ok["run_dir"].map(has_event_lines).astype(bool)
    with_lines = ok[kept]
    if with_lines.empty and not ok.empty and not wanted:
        return None
    ok = with_lines
    if wanted:
        match = runs[runs["run_id"].str.startswith(wanted)]
        if len(match) != 1:
            raise UserError(f"--timeline {wanted!r} matches {len(match)} runs; give one run id "
                            "(a directory name under the results directory)")
        return match.iloc[0]
    if ok.empty:
        raise UserError("no ok run to draw a timeline for; see report.md for why runs failed")
    pool = ok[ok["algorithm"] == baseline]
    pool = pool if not pool.empty else ok
    slow = pool["slowdown_s"] if "slowdown_s" in pool else pd.Series(0.0, index=pool.index)
    return pool.loc[slow.fillna(0.0).idxmax()]


#: Rows drawn at most; beyond this, the most-slowed workers plus an even sample of the rest.
MAX_ROWS = 32


def _rows(by_rank: dict[int, list[dict]]) -> list[int]:
    """The workers to draw: all of them, or (for big worlds) a readable subset."""
    ranks = sorted(by_rank)
    if len(ranks) <= MAX_ROWS:
        return ranks
    slowed = sorted(ranks, key=lambda r: -sum(e.get("slowdown_s", 0.0) or 0.0
                                              for e in by_rank[r]))[:MAX_ROWS // 4]
    rest = [r for r in ranks if r not in slowed]
    step = len(rest) / (MAX_ROWS - len(slowed))
    return sorted(set(slowed) | {rest[int(i * step)] for i in range(MAX_ROWS - len(slowed))})


def timeline_plot(run_dir: str | Path, path: Path, warmup_iterations: int = 5,
                  iterations: int = 20) -> Path:
    """Draw about `iterations` typical iterations of the steady state, a row per worker."""
    by_rank = {rank: events for rank, events in load_rank_events(Path(run_dir)).items()
               if events}
    if not by_rank:
        if RunDir(run_dir).workers.exists():
            raise UserError(f"run {Path(run_dir).name} was simulated with one record per "
                            "worker and no event lines; simulate it with `bench sim --events "
                            "full` to draw it")
        raise UserError(f"run {Path(run_dir).name} has no events to draw; pick another run")
    # Waiting the log counts inside communication (allreduce's) is drawn as waiting.
    by_rank = with_inferred_waits(by_rank, run_waits(run_dir, by_rank))
    lines = [e for events in by_rank.values() for e in events]
    window = throughput_window(by_rank, warmup_iterations)
    t0 = window[0] if window else min(e["t_start"] for e in lines)
    # A fixed span in typical iterations keeps single bars readable at any speed.
    span = iterations * statistics.median(e["t_end"] - e["t_start"] for e in lines)
    t1 = min(window[1] if window else max(e["t_end"] for e in lines), t0 + int(span))
    ranks = _rows(by_rank)
    fig = new_figure(10, 0.45 * len(ranks) + 1.6)
    ax = fig.subplots()
    for column, label, color in PHASES:
        for row, rank in enumerate(ranks):
            bars = []
            for e in by_rank[rank]:
                if e["t_end"] < t0 or e["t_start"] > t1:
                    continue
                start = (e["t_start"] - t0) / 1e9
                for phase, _, _ in PHASES:
                    length = max(float(e.get(phase, 0.0) or 0.0), 0.0)
                    if phase == column and length > 0:
                        bars.append((start, length))
                    start += length
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=color, linewidth=0)
        ax.bar(0, 0, color=color, label=label)  # legend entry
    ax.set_xlim(0, (t1 - t0) / 1e9)
    ax.set_yticks(range(len(ranks)), [f"worker {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the end of warm-up")
    shown = "" if len(ranks) == len(by_rank) else f" ({len(ranks)} of {len(by_rank)} workers)"
    ax.set_title(f"timeline: {Path(run_dir).name}{shown}", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
    fig.savefig(path)
    return path
