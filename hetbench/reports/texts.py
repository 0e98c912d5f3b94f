"""The words of report.md and report.html: each section's explanation, kept apart from the
code that builds the sections (report.py) so that either reads on its own."""

from __future__ import annotations

from hetbench.reports.waits import RULES, RunWaits

SYNC_TEXT = (
    "Synchronization health, mean over seeds: `sync_share` = the share of iterations in which a "
    "worker averaged with at least one peer (`sync_intended`: what its protocol does without "
    "stragglers), `mean_group_size` = the worker plus the peers it mixed in, `mean_staleness` = "
    "how many iterations apart the averaged models were (ps-async: server updates), consensus "
    "distance = mean squared distance of the workers' models from their average (final, and "
    "mean over the evaluation snapshots: in a run with a target, every worker's model after "
    "the same iteration, the last all had finished by the snapshot's moment, so All-Reduce's is "
    "0; without a target, each worker's model at that moment, which may be a step apart). "
    "A cell averaging markedly less than its protocol intends (`sync_flag`) is flagged here and "
    "at the top of the report: its throughput is not comparable. `sync_note` says what is no "
    "defect: a protocol that averages rarely by design (DiLoCo, local SGD), or an algorithm "
    "whose steps do not say whom they averaged with.")
SYNC_WARNINGS_HEAD = ("Synchronization warnings (these cells averaged with their peers markedly "
                      "less often than their protocol intends: their throughput is not "
                      "comparable):")
TARGET_WARNINGS_HEAD = ("Targets crossed, not held (these cells touched the target, but most "
                        "of their seeds fell back below it before the run ended: their time to "
                        "target is shown marked, and is no result):")
FACTS_TEXT = (
    "What each algorithm counts of its own runs (its `summary_facts`, with the units of its "
    "`fact_units`), mean over the cell's ok seeds; report.csv has them as `fact:<name>` "
    "columns, and each run's summary.json its own values.")
TUNED_TEXT = (
    "Each algorithm's best `bench tune` trial in each cell: its time to target (mean over "
    "seeds; a trial counts only if every seed reached the target), the values it drew, how many "
    "of its trials reached the target, and its speedup over {baseline}'s best trial.")
SPEEDUP_TEXT = (
    "Time-to-target speedup over {baseline}: the mean over seeds of {baseline}'s time / this "
    "time (each seed against {baseline}'s run of the same seed; > 1 is faster) ± the 95% "
    "Student-t interval's half-width, and n, the seeds paired. A cell reaches the target only "
    "when most of its seeds held it (every later evaluation within the target's hold "
    "tolerance); a cell, or a baseline, that crossed it without that is marked \"crossed, not "
    "held\" and is no result. Times are found to one worker step for runs given the target, "
    "else interpolated between evaluations: the `resolution` column below says which.")


THROUGHPUT_TEXT = (
    "Throughput is samples/s of all workers in the steady-state window (after warm-up, while "
    "every worker runs), mean over seeds; `throughput_vs_{baseline}` divides by {baseline} in "
    "the same workload/workers/slowdown, and `ratio_mean` ± (`ratio_low`, `ratio_high`) is the "
    "mean over seeds of each seed's ratio to {baseline}'s run of that seed with its 95% "
    "Student-t interval (`ratio_n` seeds paired).")
PRAGUE_TEXT = (
    "Laid out like the Prague slides: rows workloads, columns algorithms, a block per slowdown. "
    "Every value is divided by {baseline} with no slowdown in the same workload and worker "
    "count, so a slowdown block shows what each algorithm loses (where no run without slowdown "
    "exists, by {baseline} under the same slowdown): the mean over seeds of each seed's ratio "
    "(to {baseline}'s run of the same seed) ± its 95% Student-t interval's half-width, and n.")
TTT_TEXT = (
    "Wall seconds (and iterations) until the evaluated model (the run metadata's "
    "`evaluated_model`: the average of the workers' models, or the model the algorithm "
    "produces, a parameter server's or DiLoCo's outer model) first meets the target, mean "
    "over the seeds that held it (over those that crossed it where most did not hold it). "
    "`crossed`: seeds whose model met the target at some moment; `held`: those whose "
    "every later evaluation stayed within the target's hold tolerance; `verdict`: \"held\" "
    "when most seeds held it, \"crossed, not held\", or \"not reached\". `resolution`: \"1 "
    "step (refined)\" for runs whose matrix named the target (found after training over every "
    "worker's model after each step, once an evaluation met the target), \"interpolated\" "
    "(linearly between the two evaluations around the crossing, eval_interval_s apart) "
    "otherwise. speedup_vs_{baseline}: the mean of per-seed {baseline} time / this time (> 1 "
    "is faster), speedup_low/high its 95% t-interval, speedup_n the seeds paired.")

NO_EVALS = ("No ok run has evaluations (failed runs have none; emulated compute measures "
            "throughput only).")
TIMELINE_TEXT = (
    "Timeline of run {run}: each worker's compute, injected slowdown, waiting and communication "
    "per iteration (`bench report --timeline RUN_ID` draws another run). The whole run is in "
    "timeline.json beside this report: open it in ui.perfetto.dev or chrome://tracing "
    "(`bench export trace` writes it for any run).")
WAITS_TEXT = (
    "Each worker's waiting over the whole run, attributed to the worker whose arrival ended it "
    "(arrival = when its gradient or model was ready: the end of its compute and injected "
    "slowdown). `most_waited_on` is the worker most of it was spent on, `share_on_it` its share "
    "of the run's waiting; `*` marks a slowed worker (its injected slowdown is over twice the "
    "median of the other workers' and over 10% of its compute). waits.csv has every (run, "
    "worker, waited-on) pair. Rules: {rules}.")
WAITS_DETAIL_TEXT = (
    "Per worker: seconds waited, on whom (`unattributed_s`: waiting the rule cannot pin on a "
    "worker, e.g. transfer after everyone had arrived); the heatmap has a row per waiting worker "
    "and a column per worker waited on.")


def waits_text(waits: tuple[RunWaits, ...]) -> str:
    """WAITS_TEXT with the rules of the runs in this report, and why some are not attributed."""
    # Each rule applied, with the algorithms of this report that declared it.
    used: dict[str, tuple[str, set[str]]] = {}
    for w in waits:
        if w.rule:
            text, names = used.setdefault(w.rule, (w.rule_text or RULES.get(w.rule, ""), set()))
            names.add(w.algorithm)
    rules = "; ".join(f"{rule} ({', '.join(sorted(names))}): {text}"
                      for rule, (text, names) in used.items()) or "none apply"
    text = WAITS_TEXT.format(rules=rules)
    # One line per reason (several runs of one algorithm share it).
    skipped = {w.reason: w.algorithm for w in waits if not w.rule}
    if skipped:
        text += " Not attributed: " + "; ".join(
            f"{algorithm}: {reason}" for reason, algorithm in skipped.items()) + "."
    return text
