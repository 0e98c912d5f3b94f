"""`bench report DIR`: markdown, CSV, PNG plots, a timeline and one HTML page from stored runs."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape as html_escape
from pathlib import Path

import pandas as pd

from hetbench.core.store import write_text_atomic
from hetbench.errors import UserError
from hetbench.reports.html import Page
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
    to_markdown,
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


@dataclass(frozen=True)
class Section:
    """An extra section of the report (e.g. published vs measured, from `bench reproduce`)."""

    heading: str
    text: str
    table: pd.DataFrame


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

    `extra(report) -> [Section]` adds sections computed from the report's tables.
    """
    report = build_report(results_dir, baseline, targets, scan)
    if extra is not None:
        report.extra = tuple(extra(report))
    out = report.results_dir
    paths: dict[str, Path] = {"csv": out / "report.csv"}
    report.extra = (*report.extra, *(Section(*part) for part in tolerance_sections(report, paths)))
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
    images = [p for k, p in paths.items() if k.startswith("plot") or k in ("timeline",
                                                                           "headline")]
    paths["md"] = out / "report.md"
    write_text_atomic(paths["md"], markdown(report, images))
    paths["html"] = out / "report.html"
    write_text_atomic(paths["html"], html_page(report, images).render())
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


def markdown(report: Report, images: list[Path]) -> str:
    """report.md: the tables, and links to the PNGs beside it."""
    baseline, runs = report.baseline, report.runs
    parts = [
        f"# hetbench report: {report.results_dir}",
        "",
        f"{len(runs)} run(s), {len(runs) - len(report.failed)} ok, {len(report.failed)} not ok. "
        + THROUGHPUT_TEXT.format(baseline=baseline),
    ]
    warnings = report.sync_warnings()
    if warnings:
        parts += ["", f"**{SYNC_WARNINGS_HEAD}**", "", *(f"- **{w}**" for w in warnings)]
    lost = report.target_warnings()
    if lost:
        parts += ["", f"**{TARGET_WARNINGS_HEAD}**", "", *(f"- **{w}**" for w in lost)]
    notes = report.notes()
    if notes:
        parts += ["", *(f"- {n}" for n in notes)]
    headline = [path for path in images if path.stem == "headline"]
    images = [path for path in images if path.stem != "headline"]
    if headline:  # every algorithm against the baseline, before any table
        parts += ["", f"![headline]({headline[0].name})"]
    if report.tuned is not None:
        parts += ["", "## Tuned comparison", "", TUNED_TEXT.format(baseline=baseline), "",
                  to_markdown(report.tuned)]
    for section in report.extra:
        parts += ["", f"## {section.heading}", "", section.text, "", to_markdown(section.table)]
    speedups = speedup_table(report.time_to_target, baseline)
    if not speedups.empty:
        parts += ["", f"## Time to target: speedup over {baseline}", "",
                  SPEEDUP_TEXT.format(baseline=baseline), "", to_markdown(speedups)]
    parts += ["", "## Throughput normalised to " + baseline, "", PRAGUE_TEXT.format(
        baseline=baseline)]
    for slowdown, block in report.flagged_blocks().items():
        parts += ["", f"### slowdown: {slowdown}", "", to_markdown(block)]
    parts += ["", "## Synchronization health", "", SYNC_TEXT, "", to_markdown(report.health())]
    facts = report.facts()
    if facts:
        parts += ["", "## Algorithms' own facts", "", FACTS_TEXT]
        for algorithm, table in facts.items():
            parts += ["", f"### {algorithm}", "", to_markdown(table)]
    if report.waits:
        parts += ["", "## Who waited for whom", "", waits_text(report.waits), "",
                  to_markdown(waits_summary(list(report.waits)))]
        detail = report.waits_detail
        if detail is not None:
            parts += ["", f"### Run {detail.run_id}", "", WAITS_DETAIL_TEXT, "",
                      to_markdown(detail.per_worker()), "", "![waits](waits.png)"]
    parts += ["", "## Throughput (samples/s)", "", to_markdown(report.throughput)]
    parts += ["", "## Time to target", "", TTT_TEXT.format(baseline=baseline), ""]
    parts.append(to_markdown(report.time_to_target) if not report.time_to_target.empty
                 else NO_EVALS)
    if images:
        parts += ["", "## Plots", ""]
        for path in images:
            if path.stem == "timeline":
                parts += ["", TIMELINE_TEXT.format(run=report.timeline_of), ""]
            parts.append(f"![{path.stem}]({path.name})")
    if not report.failed.empty:
        parts += ["", "## Runs not ok", "",
                  to_markdown(report.failed[["run_id", "status", "cause"]].fillna(""))]
    parts += ["", "## Run metadata", "", to_markdown(metadata(runs))]
    return "\n".join(parts) + "\n"


def html_page(report: Report, images: list[Path]) -> Page:
    """report.html: report.md's content, laid out to read at a glance: what a reader must know
    first (warnings, notes), then the headline (a figure of every algorithm against the
    baseline beside its tables), then each section with its definitions folded and its plot
    beside its table; run metadata folded at the end."""
    page = Page(f"hetbench report: {report.results_dir.name}")
    runs, baseline = report.runs, report.baseline
    by_stem = {path.stem: path for path in images}
    page.paragraph(f"{len(runs)} run(s), {len(runs) - len(report.failed)} ok, "
                   f"{len(report.failed)} not ok.")
    warnings = report.sync_warnings()
    if warnings:
        page.paragraph(SYNC_WARNINGS_HEAD, "warning")
        page.bullets(warnings)
    lost = report.target_warnings()
    if lost:
        page.paragraph(TARGET_WARNINGS_HEAD, "warning")
        page.bullets(lost)
    page.bullets(report.notes())

    page.heading(f"Headline: each algorithm against {baseline}")
    speedups = speedup_table(report.time_to_target, baseline)
    tables = "".join(
        ([Page.table_html(speedups, "time-to-target speedup")] if not speedups.empty else [])
        + [Page.table_html(block, f"throughput / {baseline}, slowdown: {slowdown}")
           for slowdown, block in report.flagged_blocks().items()])
    if "headline" in by_stem:
        page.pair(Page.image_html(by_stem["headline"], "headline", element_id="headline"),
                  tables, wide_left=True)
    else:
        page.parts.append(tables)
    page.help(THROUGHPUT_TEXT.format(baseline=baseline) + " "
              + PRAGUE_TEXT.format(baseline=baseline)
              + ("" if speedups.empty else " " + SPEEDUP_TEXT.format(baseline=baseline)))

    if report.tuned is not None:
        page.heading("Tuned comparison")
        page.help(TUNED_TEXT.format(baseline=baseline))
        page.table(report.tuned)
    for section in report.extra:
        page.heading(section.heading)
        page.help(section.text)
        plot = by_stem.get("tolerance") if section.heading.startswith("Tolerance") else None
        if plot is not None:
            page.pair(Page.image_html(plot, section.heading), Page.table_html(section.table))
        else:
            page.table(section.table)

    page.heading("Time to target")
    page.help(TTT_TEXT.format(baseline=baseline))
    convergence = [path for path in images if path.stem.startswith(("scaling", "convergence"))]
    table = (Page.table_html(report.time_to_target) if not report.time_to_target.empty
             else f"<p>{html_escape(NO_EVALS)}</p>")
    if convergence:
        page.pair(table, "".join(Page.image_html(path, path.stem) for path in convergence))
    else:
        page.parts.append(table)

    page.heading("Synchronization health")
    page.help(SYNC_TEXT)
    page.table(report.health())
    facts = report.facts()
    if facts:
        page.heading("Algorithms' own facts")
        page.help(FACTS_TEXT)
        for algorithm, table in facts.items():
            page.heading(algorithm, 3)
            page.table(table)
    if report.waits:
        page.heading("Who waited for whom")
        page.help(waits_text(report.waits))
        page.table(waits_summary(list(report.waits)))
        detail = report.waits_detail
        if detail is not None:
            page.heading(f"Run {detail.run_id}", 3)
            page.help(WAITS_DETAIL_TEXT)
            page.pair(Page.table_html(detail.per_worker()),
                      Page.image_html(report.results_dir / "waits.png", "who waited for whom"))
    if "timeline" in by_stem:
        page.heading("Timeline")
        page.help(TIMELINE_TEXT.format(run=report.timeline_of))
        page.image(by_stem["timeline"], "timeline")
    page.heading("Throughput (samples/s)")
    page.table(report.throughput)
    if not report.failed.empty:
        page.heading("Runs not ok")
        page.table(report.failed[["run_id", "status", "cause"]].fillna(""))
    page.heading("Run metadata")
    page.parts.append("<details><summary>Where and how each run was measured</summary>"
                      + Page.table_html(metadata(runs)) + "</details>")
    return page
