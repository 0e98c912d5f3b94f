"""`bench report DIR`: markdown, CSV, PNG plots, a timeline and one HTML page from stored runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hetbench.core.record import runs_read_once
from hetbench.core.store import write_text_atomic
from hetbench.errors import UserError
from hetbench.reports.intervals import Interval
from hetbench.reports.latex import report_tex
from hetbench.reports.load import Scan, load_evals, load_runs, scan_runs
from hetbench.reports.notes import (
    baseline_notes,
    clock_notes,
    gpu_notes,
    host_notes,
    metadata,
    network_notes,
    point_to_point_note,
    reading_notes,
    timing_notes,
)
from hetbench.reports.plots import convergence_plots, headline_plot, scaling_plots
from hetbench.reports.sections import Section, Warnings, render_html, render_markdown
from hetbench.reports.tables import (
    HEALTH_COLUMNS,
    KEYS,
    facts_by_cell,
    facts_tables,
    format_number,
    prague_intervals,
    prague_table,
    speedup_table,
    throughput_table,
    time_to_target_table,
)
from hetbench.reports.targets import NOT_HELD, Target, resolve_targets
from hetbench.reports.texts import (
    FACTS_TEXT,
    NO_EVALS,
    PRAGUE_TEXT,
    SPEEDUP_TEXT,
    SYNC_TEXT,
    SYNC_WARNINGS_HEAD,
    TARGET_WARNINGS_HEAD,
    THROUGHPUT_TEXT,
    TIMELINE_TEXT,
    TTT_TEXT,
    TUNED_TEXT,
    WAITS_DETAIL_TEXT,
    waits_text,
)
from hetbench.reports.timeline import choose_run, timeline_plot
from hetbench.reports.tolerance import tolerance_sections
from hetbench.reports.trace import write_trace
from hetbench.reports.tuned import convention, load_tuning, tuned_table
from hetbench.reports.waits import (
    RunWaits,
    run_waits,
    waits_heatmap,
    waits_long,
    waits_summary,
)

#: Columns of report.csv (the first six are a stable interface; scripts read them), then
#: every algorithm's own facts as `fact:<name>` (tables.facts_by_cell).
CSV_COLUMNS = ["algorithm", "workload", "workers", "slowdown", "throughput",
               "throughput_vs_{baseline}", "throughput_std", "seeds", "ratio_mean", "ratio_low",
               "ratio_high", "ratio_n", "final_test_accuracy", "final_test_perplexity",
               "compute", "synthetic", "simulated", "pace_ms", "cpu_ms_per_iteration",
               *HEALTH_COLUMNS, "sync_flag", "sync_note", "fidelity"]


@dataclass
class Report:
    """Everything `bench report` computes from one results directory."""

    results_dir: Path
    baseline: str
    runs: pd.DataFrame
    evals: pd.DataFrame
    throughput: pd.DataFrame
    prague: dict[str, pd.DataFrame]
    targets: dict[str, Target]
    time_to_target: pd.DataFrame
    #: Sections added after the tuned comparison (published vs measured, tolerance curves).
    extra: tuple[Section, ...] = ()
    #: run_id drawn in timeline.png (and traced in timeline.json), once drawn.
    timeline_of: str | None = None
    #: Who waited for whom in every ok run, and the detail of the timeline's run.
    waits: tuple[RunWaits, ...] = ()
    waits_detail: RunWaits | None = None
    #: tune.json of a `bench tune` directory (None otherwise), and its best-trial table.
    tuning: dict | None = None
    tuned: pd.DataFrame | None = None
    #: What reading the directory met: runs skipped as unreadable, runs in progress.
    scan: Scan | None = None

    @property
    def failed(self) -> pd.DataFrame:
        return self.runs[self.runs["status"] != "ok"]

    def sync_warnings(self) -> list[str]:
        """One line per cell whose throughput comes with markedly less synchronization than its
        protocol intends: shown at the top. What a protocol does by design is no warning
        (sync_note, in the health table)."""
        flagged = self.throughput[self.throughput["sync_flag"].fillna("") != ""]
        return [f"{r['algorithm']} on {r['workload']}, {r['workers']} workers, {r['slowdown']}: "
                f"{r['sync_flag']}" for _, r in flagged.iterrows()]

    def health(self) -> pd.DataFrame:
        """Synchronization health per cell, beside its throughput ratio (the report's table)."""
        columns = [*KEYS, f"throughput_vs_{self.baseline}", *HEALTH_COLUMNS, "sync_flag",
                   "sync_note"]
        return self.throughput.reindex(columns=columns)

    def flagged_blocks(self) -> dict[str, pd.DataFrame]:
        """The Prague-layout blocks, each value the mean of per-seed ratios ± its 95% interval
        (n seeds), with each flagged cell marked in place: "(low sync)", or "(sync unknown)"
        for an algorithm that does not record its peers."""
        one_size = self.throughput["workers"].nunique() == 1
        marks, spreads = {}, {}
        intervals = prague_intervals(self.runs, self.baseline)
        for _, r in self.throughput.iterrows():
            row = r["workload"] if one_size else f"{r['workload']} ({r['workers']} workers)"
            key = (row, r["slowdown"], r["algorithm"])
            spreads[key] = intervals.get(tuple(r[KEYS]), Interval.of([]))
            mark = ""
            if r.get("sync_flag"):
                mark = " (low sync)"
            elif str(r.get("sync_note") or "").startswith("not recorded"):
                mark = " (sync unknown)"
            if r.get("fidelity") == "low":  # the host fell behind the emulated network
                mark += " (low fidelity)"
            if mark:
                marks[key] = mark
        blocks = {}
        for slowdown, block in self.prague.items():
            marked = block.astype(object).copy()
            for i, row in block.iterrows():
                for algorithm in block.columns[1:]:
                    value = row[algorithm]
                    spread = spreads.get((row["workload"], slowdown, algorithm))
                    text = (spread.text(format_number) if spread is not None and spread.n
                            else format_number(value) if isinstance(value, float) else value)
                    if text:
                        text += marks.get((row["workload"], slowdown, algorithm), "")
                    marked.at[i, algorithm] = text
            blocks[slowdown] = marked
        return blocks

    def notes(self) -> list[str]:
        """What a reader must know before trusting a number: pacing, synthetic, emulated."""
        runs = self.runs
        notes = baseline_notes(runs, self.baseline)
        notes += host_notes(runs) + clock_notes(runs) + gpu_notes(runs)
        if "synthetic" in runs and runs["synthetic"].fillna(False).astype(bool).any():
            names = sorted(runs[runs["synthetic"].fillna(False).astype(bool)]["workload"].unique())
            notes.append(f"Synthetic data (not the real data set) in: {', '.join(names)}.")
        if "data" in runs:
            named = runs.dropna(subset=["data"]).groupby("workload")["data"].unique()
            sources = [f"{workload}: {', '.join(sorted(data))}" for workload, data in named.items()]
            if sources:
                notes.append(f"Data: {'; '.join(sources)}.")
        if "compute" in runs and (runs["compute"] == "emulated").any():
            names = sorted(runs[runs["compute"] == "emulated"]["workload"].unique())
            notes.append(f"Emulated compute in: {', '.join(names)} (a paced wait with real "
                         "message sizes; throughput only, no convergence).")
        if "simulated" in runs and runs["simulated"].any():
            learned = (int(runs["learned"].fillna(False).astype(bool).sum())
                       if "learned" in runs else 0)
            notes.append(f"Simulated (`bench sim`, a discrete-event model, not real processes): "
                         f"{int(runs['simulated'].sum())} of {len(runs)} run(s); see the "
                         "`simulated` column."
                         + (f" {learned} of them simulated (learned): their workers trained "
                            "real models (`bench sim --learn`), so their accuracy and time to "
                            "target are the simulation's, not a real run's." if learned else ""))
        notes += timing_notes(runs)
        paced = sorted({float(p) for p in runs.get("pace_ms", []) if p and p == p})
        if paced:
            notes.append(f"Pacing on: a floor of {', '.join(f'{p:g}' for p in paced)} ms on "
                         "every iteration's compute, so workers sharing cores behave alike.")
        if text := convention(self.runs, self.tuning):
            notes.append(text)
        notes += reading_notes(self.scan)
        notes += network_notes(runs) + point_to_point_note(runs)
        for workload, target in sorted(self.targets.items()):
            how = ("picked automatically: 90% of the lowest final accuracy of any run"
                   if target.source == "auto" else f"from {target.source}")
            notes.append(f"Target for {workload}: {target} ({how}); a run holds it when "
                         f"{target.describe_hold()}.")
        return notes

    def target_warnings(self) -> list[str]:
        """One line per cell that crossed its target without most seeds holding it (shown at
        the top): its time to target appears only with that mark, and is no result."""
        ttt = self.time_to_target
        if ttt.empty:
            return []
        lost = ttt[ttt["verdict"] == NOT_HELD]
        return [f"{r['algorithm']} on {r['workload']}, {r['workers']} workers, {r['slowdown']}: "
                f"crossed {r['target']} but only {r['held']} of {r['seeds']} seed(s) held it "
                "to the end of the run" for _, r in lost.iterrows()]

    def facts(self) -> dict[str, pd.DataFrame]:
        """Each algorithm's own facts (summary_facts) by cell."""
        return facts_tables(self.runs, self.baseline)


def build_report(results_dir: Path, baseline: str = "allreduce",
                 targets: dict[str, Target] | None = None, scan: Scan | None = None,
                 read_events: bool = True) -> Report:
    """Load the runs under `results_dir` and compute every table of the report (`scan`:
    scan_runs of it when the caller has one; `read_events`: check the event logs too)."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise UserError(f"results directory {results_dir} does not exist; run `bench run` first")
    scan = scan_runs(results_dir, events=read_events) if scan is None else scan
    runs = load_runs(results_dir, scan)
    if runs.empty:
        if scan.unreadable or scan.in_progress:
            raise UserError(f"no readable finished runs under {results_dir} yet: "
                            f"{len(scan.unreadable)} unreadable, {len(scan.in_progress)} in "
                            "progress")
        raise UserError(f"no runs under {results_dir}; run `bench run --out {results_dir}` first")
    evals = load_evals(runs)
    resolved = resolve_targets(evals, targets or {})
    table = throughput_table(runs, baseline)
    tuning = load_tuning(results_dir)
    return Report(results_dir, baseline, runs, evals, table, prague_table(table, baseline),
                  resolved, time_to_target_table(runs, evals, resolved, baseline),
                  tuning=tuning,
                  tuned=tuned_table(runs, evals, resolved, tuning, baseline) if tuning else None,
                  scan=scan)


def write_report(results_dir: Path, baseline: str = "allreduce",
                 targets: dict[str, Target] | None = None,
                 timeline_run: str | None = None,
                 extra=None, scan: Scan | None = None) -> dict[str, Path]:
    """Write every report file into `results_dir`; returns their paths by kind.

    `extra(report) -> [Section]` adds sections computed from the report's tables. Each event
    log is read once (runs_read_once), for the scan, the waits, the timeline and the trace.
    """
    with runs_read_once():
        return _write_report(results_dir, baseline, targets, timeline_run, extra, scan)


def _write_report(results_dir, baseline, targets, timeline_run, extra, scan):
    """write_report's work, inside its runs_read_once scope."""
    report = build_report(results_dir, baseline, targets, scan)
    if extra is not None:
        report.extra = tuple(extra(report))
    out = report.results_dir
    paths: dict[str, Path] = {"csv": out / "report.csv"}
    report.extra = (*report.extra, *tolerance_sections(report, paths))
    columns = [c.format(baseline=baseline) for c in CSV_COLUMNS]
    csv = (report.throughput.reindex(columns=columns)
           .merge(target_columns(report.time_to_target, baseline), on=KEYS, how="left")
           .merge(facts_by_cell(report.runs), on=KEYS, how="left"))
    write_text_atomic(paths["csv"], csv.to_csv(index=False))
    paths["tex"] = out / "report.tex"
    write_text_atomic(paths["tex"], report_tex(report.throughput, report.time_to_target,
                                               baseline))
    paths["time_to_target_csv"] = out / "time_to_target.csv"
    write_text_atomic(paths["time_to_target_csv"], report.time_to_target.to_csv(index=False))
    if report.tuned is not None:
        paths["tuned_csv"] = out / "tuned.csv"
        write_text_atomic(paths["tuned_csv"], report.tuned.to_csv(index=False))
    for i, path in enumerate(convergence_plots(report.evals, out, baseline, report.targets)):
        paths[f"plot{i}"] = path
    for path in scaling_plots(report.time_to_target, out, baseline):
        paths[f"plot_{path.stem}"] = path
    ok = report.runs[report.runs["status"] == "ok"]
    report.waits = tuple(run_waits(run_dir) for run_dir in ok["run_dir"])
    paths["waits_csv"] = out / "waits.csv"
    write_text_atomic(paths["waits_csv"], waits_long(list(report.waits)).to_csv(index=False))
    run = choose_run(report.runs, baseline, timeline_run) if timeline_run or not ok.empty else None
    if run is not None:
        warmup = run.get("warmup_iterations")
        paths["timeline"] = timeline_plot(run["run_dir"], out / "timeline.png",
                                          5 if pd.isna(warmup) else int(warmup))
        paths["trace"] = write_trace(run["run_dir"], out / "timeline.json")
        report.timeline_of = run["run_id"]
        detail = next((w for w in report.waits if w.run_id == run["run_id"]), None)
        if detail is not None and detail.attributed and not detail.table.empty:
            report.waits_detail = detail
            paths["waits_png"] = waits_heatmap(detail, out / "waits.png")
    headline = headline_plot(report.throughput, report.time_to_target, out / "headline.png",
                             baseline)
    if headline is not None:
        paths["headline"] = headline
    sections = report_sections(report, [path for path in paths.values() if path.suffix == ".png"])
    paths["md"] = out / "report.md"
    write_text_atomic(paths["md"], render_markdown(sections))
    paths["html"] = out / "report.html"
    write_text_atomic(paths["html"], render_html(sections))
    return paths


def target_columns(ttt: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """What report.csv says of each cell's target: the verdict (held by most seeds, crossed
    and not held, not reached), the seeds that held it, and the speedup with its interval."""
    columns = {"target": "target", "verdict": "target_verdict", "held": "target_held",
               "crossed": "target_crossed", "time_to_target_s": "time_to_target_s",
               f"speedup_vs_{baseline}": f"speedup_vs_{baseline}",
               "speedup_low": "speedup_low", "speedup_high": "speedup_high",
               "speedup_n": "speedup_n"}
    if ttt.empty:
        return pd.DataFrame(columns=[*KEYS, *columns.values()])
    return ttt[[*KEYS, *columns]].rename(columns=columns)


def report_sections(report: Report, images: list[Path]) -> list[Section]:
    """The report as both report.md and report.html show it, section by section: what a reader
    must know first (the run count, warnings, notes), the headline (every algorithm against the
    baseline), then each section with its definitions and plots, the run metadata last.
    `images`: the PNGs written beside the report, each shown in the section it illustrates."""
    baseline, runs, failed = report.baseline, report.runs, report.failed

    def plots(*names: str) -> tuple[Path, ...]:
        """The PNGs whose names start with one of `names`; each PNG has one section (an added
        section brings its own: tolerance.png is the tolerance section's)."""
        return tuple(path for path in images if path.stem.startswith(names))

    warnings = [Warnings(head, tuple(lines)) for head, lines in (
        (SYNC_WARNINGS_HEAD, report.sync_warnings()),
        (TARGET_WARNINGS_HEAD, report.target_warnings())) if lines]
    sections = [Section(f"hetbench report: {report.results_dir.name}", level=1,
                        paragraphs=(f"{len(runs)} run(s), {len(runs) - len(failed)} ok, "
                                    f"{len(failed)} not ok.",),
                        warnings=tuple(warnings), bullets=tuple(report.notes()))]
    # The headline, before any other table: what a reader came for.
    sections.append(Section(f"Headline: each algorithm against {baseline}",
                            THROUGHPUT_TEXT.format(baseline=baseline), images=plots("headline"),
                            headline=True))
    speedups = speedup_table(report.time_to_target, baseline)
    if not speedups.empty:
        sections.append(Section(f"Time to target: speedup over {baseline}",
                                SPEEDUP_TEXT.format(baseline=baseline), speedups, headline=True))
    sections.append(Section(f"Throughput normalised to {baseline}",
                            PRAGUE_TEXT.format(baseline=baseline), headline=True))
    sections += [Section(f"slowdown: {slowdown}", table=block, level=3, headline=True)
                 for slowdown, block in report.flagged_blocks().items()]
    if report.tuned is not None:
        sections.append(Section("Tuned comparison", TUNED_TEXT.format(baseline=baseline),
                                report.tuned))
    sections += report.extra
    ttt = report.time_to_target
    sections.append(Section("Time to target", TTT_TEXT.format(baseline=baseline),
                            None if ttt.empty else ttt,
                            paragraphs=(NO_EVALS,) if ttt.empty else (),
                            images=plots("convergence", "scaling")))
    sections.append(Section("Synchronization health", SYNC_TEXT, report.health()))
    facts = report.facts()
    if facts:
        sections.append(Section("Algorithms' own facts", FACTS_TEXT))
        sections += [Section(algorithm, table=table, level=3) for algorithm, table in facts.items()]
    if report.waits:
        sections.append(Section("Who waited for whom", waits_text(report.waits),
                                waits_summary(list(report.waits))))
        detail = report.waits_detail
        if detail is not None:
            sections.append(Section(f"Run {detail.run_id}", WAITS_DETAIL_TEXT,
                                    detail.per_worker(), level=3, images=plots("waits")))
    # A figure of one run, not of a table: a section of its own.
    if plots("timeline"):
        sections.append(Section("Timeline", TIMELINE_TEXT.format(run=report.timeline_of),
                                images=plots("timeline")))
    sections.append(Section("Throughput (samples/s)", table=report.throughput))
    if not failed.empty:
        sections.append(Section("Runs not ok",
                                table=failed[["run_id", "status", "cause"]].fillna("")))
    # Where and how each run was measured: for the reader who checks, so folded in report.html.
    sections.append(Section("Run metadata", table=metadata(runs),
                            fold="Where and how each run was measured"))
    return sections
