"""Tables: throughput normalised to All-Reduce (flat and Prague-slides layout), time to target."""

from __future__ import annotations

import math

import pandas as pd

from hetbench.core.registry import ALGORITHMS
from hetbench.core.variants import base_name
from hetbench.reports.intervals import Interval, paired_ratios
from hetbench.reports.targets import HELD, NOT_HELD, NOT_REACHED, Target, reach

KEYS = ["algorithm", "workload", "workers", "slowdown"]
CELL = ["workload", "workers", "slowdown"]


def throughput_table(runs: pd.DataFrame, baseline: str = "allreduce") -> pd.DataFrame:
    """Mean and spread of throughput over seeds, and the ratio to `baseline` in the same cell."""
    ok = runs[runs["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame(columns=[*KEYS, "throughput", "throughput_std", "seeds",
                                     f"throughput_vs_{baseline}"])
    table = (ok.groupby(KEYS, sort=True)["throughput"]
             .agg(throughput="mean", throughput_std="std", seeds="count").reset_index())
    table["throughput_std"] = table["throughput_std"].fillna(0.0)
    base = (table[table["algorithm"] == baseline][[*CELL, "throughput"]]
            .rename(columns={"throughput": "_base"}))
    table = table.merge(base, on=CELL, how="left")
    table[f"throughput_vs_{baseline}"] = table["throughput"] / table["_base"]
    table = table.drop(columns="_base")
    # The ratio's spread: each seed's run against the baseline's run of the same seed.
    by_seed = seed_values(ok, "throughput")
    intervals = [paired_ratios(by_seed.get(tuple(row[KEYS]), {}),
                               by_seed.get((baseline, *row[CELL]), {}))
                 for _, row in table.iterrows()]
    table["ratio_mean"] = [i.mean for i in intervals]
    table["ratio_low"] = [i.low for i in intervals]
    table["ratio_high"] = [i.high for i in intervals]
    table["ratio_n"] = [i.n for i in intervals]
    # CPU every process of the run spent per worker iteration (empty for simulated runs and runs
    # of an older hetbench): what an algorithm costs the cores, beside its speed.
    cpu_s = pd.to_numeric(ok["train_cpu_s"], errors="coerce") if "train_cpu_s" in ok else math.nan
    cpu = ok[KEYS].assign(cpu_ms_per_iteration=cpu_s * 1e3 / ok["iterations"])
    table = table.merge(cpu.groupby(KEYS)["cpu_ms_per_iteration"].mean().reset_index(),
                        on=KEYS, how="left")
    for column in ("final_test_accuracy", "final_test_perplexity", *HEALTH_COLUMNS, "compute",
                   "synthetic", "simulated", "pace_ms"):
        if column in ok:
            if column in ("compute", "synthetic", "simulated", "pace_ms"):
                values = ok.groupby(KEYS)[column].agg("first")
            else:
                values = pd.to_numeric(ok[column], errors="coerce").groupby(
                    [ok[k] for k in KEYS]).mean()
            table = table.merge(values.rename(column).reset_index(), on=KEYS, how="left")
    # An emulated network's fidelity (summary.json): a cell is as trustworthy as its worst
    # run ("low" if any seed's host fell behind the model; "" without a network model).
    if "fidelity" in ok:
        worst = ok.groupby(KEYS)["fidelity"].agg(_worst_fidelity)
        table = table.merge(worst.rename("fidelity").reset_index(), on=KEYS, how="left")
    table["sync_flag"] = [sync_flag(row.get("sync_share"), row.get("sync_intended"))
                          for _, row in table.iterrows()]
    table["sync_note"] = [
        sync_note(row.get("sync_share"), row.get("sync_intended"), bool(row.get("simulated")))
        for _, row in table.iterrows()]
    return table


def seed_values(runs: pd.DataFrame, column: str) -> dict[tuple, dict]:
    """{(algorithm, workload, workers, slowdown): {seed: value}} of the runs given."""
    found: dict[tuple, dict] = {}
    for _, row in runs.iterrows():
        found.setdefault(tuple(row[KEYS]), {})[row["seed"]] = row[column]
    return found


#: Synchronization health, per run in summary.json and as means over seeds in report tables.
HEALTH_COLUMNS = ("sync_share", "sync_intended", "mean_group_size", "mean_staleness",
                  "final_consensus_distance", "mean_consensus_distance")
#: A run averaging with a peer this much (absolute share) below its protocol's intent is flagged.
SYNC_SHORTFALL = 0.10
#: A protocol that means to average in fewer iterations than this is noted as rare by design
#: (DiLoCo, local SGD): worth knowing beside its throughput, but no defect.
SYNC_RARE = 0.5


def _worst_fidelity(values) -> str:
    levels = {v for v in values if isinstance(v, str)}
    for level in ("low", "unknown", "high"):
        if level in levels:
            return level
    return ""


def sync_flag(share, intended) -> str:
    """The warning a reader must see beside a cell's throughput, or "": the cell averaged
    markedly less than its protocol intends (a throughput win bought by averaging less is no
    win). Only a defect is a warning; what a protocol does by design is a note (sync_note)."""
    if share is None or pd.isna(share) or intended is None or pd.isna(intended):
        return ""
    if share < intended - SYNC_SHORTFALL:
        return (f"LOW SYNC: averaged with a peer in {share:.0%} of iterations; its protocol "
                f"does in {intended:.0%} without stragglers")
    return ""


def sync_note(share, intended, simulated: bool = False) -> str:
    """What the synchronization-health table says beside a cell that is no defect: a protocol
    that averages rarely by design, or an algorithm whose steps do not say whom they averaged
    with (so no warning can be raised either way)."""
    if share is None or pd.isna(share):
        # The simulator does not model peers; a real run without them has an algorithm (a
        # plugin, most likely) whose steps do not say whom they averaged with.
        return "" if simulated else "not recorded (StepInfo.peers): cannot be checked"
    if intended is not None and not pd.isna(intended) and intended < SYNC_RARE:
        return f"rare by design: its protocol averages in {intended:.0%} of iterations"
    return ""


def order_algorithms(names, baseline: str = "allreduce") -> list[str]:
    """The baseline first, then the built-ins in the registry's order (the papers'), then
    plugins by name."""
    names = set(names)
    rank = {name: i for i, name in enumerate(ALGORITHMS.builtin_order)}
    # A variant (`hop[backup_workers=2]`) sits beside its algorithm, after the bare name.
    rest = sorted(names - {baseline}, key=lambda n: (rank.get(base_name(n), len(rank)),
                                                     base_name(n), n != base_name(n), n))
    return ([baseline] if baseline in names else []) + rest


def prague_table(table: pd.DataFrame, baseline: str = "allreduce",
                 reference_slowdown: str = "none") -> dict[str, pd.DataFrame]:
    """Throughput per slowdown block, rows workloads, columns algorithms (the Prague slides).

    Each value is throughput / the baseline's throughput in the same workload and worker count
    under `reference_slowdown` (as the slides do, so a slowdown block shows what every algorithm,
    the baseline included, loses); where that cell was not run, under the block's own slowdown.
    """
    blocks: dict[str, pd.DataFrame] = {}
    if table.empty:
        return blocks
    table = table.copy()
    one_size = table["workers"].nunique() == 1
    table["row"] = (table["workload"] if one_size
                    else table["workload"] + " (" + table["workers"].astype(str) + " workers)")
    base = table[table["algorithm"] == baseline].set_index(["workload", "workers", "slowdown"])
    base = base["throughput"]

    def reference(row) -> float:
        for slowdown in (reference_slowdown, row["slowdown"]):
            key = (row["workload"], row["workers"], slowdown)
            if key in base.index:
                return float(base[key])
        return math.nan

    table["value"] = table["throughput"] / table.apply(reference, axis=1)
    columns = order_algorithms(table["algorithm"], baseline)
    slowdowns = sorted(table["slowdown"].unique(), key=lambda s: (s != reference_slowdown, s))
    for slowdown in slowdowns:
        block = table[table["slowdown"] == slowdown].pivot_table(
            index="row", columns="algorithm", values="value", aggfunc="first")
        block = block.reindex(columns=[c for c in columns if c in block.columns])
        block.index.name = "workload"
        block.columns.name = None
        blocks[slowdown] = block.reset_index()
    return blocks


def prague_intervals(runs: pd.DataFrame, baseline: str = "allreduce",
                     reference_slowdown: str = "none") -> dict[tuple, Interval]:
    """The spread of prague_table's values: per (algorithm, workload, workers, slowdown), the
    interval of per-seed throughput ratios against the same reference prague_table divides by
    (the baseline's run of the same seed under `reference_slowdown`, else under the cell's
    own slowdown)."""
    ok = runs[runs["status"] == "ok"]
    by_seed = seed_values(ok, "throughput")
    found = {}
    for key, values in by_seed.items():
        _, workload, workers, slowdown = key
        for reference in (reference_slowdown, slowdown):
            base = by_seed.get((baseline, workload, workers, reference))
            if base is not None:
                found[key] = paired_ratios(values, base)
                break
    return found


def time_to_target_table(runs: pd.DataFrame, evals: pd.DataFrame, targets: dict[str, Target],
                         baseline: str = "allreduce") -> pd.DataFrame:
    """Per cell: how many seeds crossed each workload's target and how many held it, the
    verdict, the seconds and iterations to it (mean over the seeds that held it, or over those
    that crossed where too few held), and the speedup over `baseline`.

    A cell reaches the target only when most of its seeds held it (AlgoPerf's rule): a run that
    crossed and fell back counts as crossed, not held, and so does its cell then, in every
    table and figure. Speedup = the mean over seeds of the baseline's time / this time, each
    seed against the baseline's run of the same seed (speedup_low/high: the 95% t-interval,
    speedup_n: the seeds paired); > 1 means faster to the target.
    """
    columns = [*KEYS, "target", "seeds", "crossed", "held", "verdict", "time_to_target_s",
               "time_to_target_std", "iterations_to_target", f"speedup_vs_{baseline}",
               "speedup_low", "speedup_high", "speedup_n", "resolution"]
    rows = []
    for run_id, run_evals in evals.groupby("run_id", sort=False):
        workload = run_evals["workload"].iloc[0]
        target = targets.get(workload)
        if target is None:
            continue
        found = reach(run_evals, target)
        rows.append({**{k: run_evals[k].iloc[0] for k in KEYS}, "seed": run_evals["seed"].iloc[0],
                     "run_id": run_id, "target": str(target), "seconds": found.seconds,
                     "iteration": found.iteration, "how": found.how, "held": found.held})
    if not rows:
        return pd.DataFrame(columns=columns)
    per_run = pd.DataFrame(rows)
    out = []
    for key, group in per_run.groupby([*KEYS, "target"], sort=True):
        seeds, crossed = len(group), int(group["seconds"].notna().sum())
        held = int(group["held"].sum())
        verdict = cell_verdict(seeds, crossed, held)
        # The times of the seeds that held it; where the cell did not reach the target, of
        # those that crossed (shown, with the verdict beside them, not as a result).
        timed = group[group["held"]] if verdict == HELD else group[group["seconds"].notna()]
        out.append({**dict(zip([*KEYS, "target"], key, strict=True)), "seeds": seeds,
                    "crossed": crossed, "held": held, "verdict": verdict,
                    "time_to_target_s": timed["seconds"].mean() if len(timed) else math.nan,
                    "time_to_target_std": (timed["seconds"].std() if len(timed) > 1
                                           else 0.0 if len(timed) else math.nan),
                    "iterations_to_target": (timed["iteration"].mean() if len(timed)
                                             else math.nan),
                    "resolution": _resolution(group["how"]),
                    "_times": dict(zip(timed["seed"], timed["seconds"], strict=True))})
    table = pd.DataFrame(out)
    base = {tuple(r[CELL]): r["_times"]
            for _, r in table[table["algorithm"] == baseline].iterrows()}
    # Each seed's speedup: the baseline's time of that seed over this run's.
    intervals = [paired_ratios(base.get(tuple(r[CELL]), {}), r["_times"])
                 for _, r in table.iterrows()]
    table[f"speedup_vs_{baseline}"] = [i.mean for i in intervals]
    table["speedup_low"] = [i.low for i in intervals]
    table["speedup_high"] = [i.high for i in intervals]
    table["speedup_n"] = [i.n for i in intervals]
    return table[columns]


def cell_verdict(seeds: int, crossed: int, held: int) -> str:
    """A cell's verdict on a target: held by most of its seeds, crossed (by any seed) but not
    held by most, or not reached by any."""
    if 2 * held > seeds:
        return HELD
    return NOT_HELD if crossed else NOT_REACHED


def _resolution(hows: pd.Series) -> str:
    """How the cell's times were found: to one worker step, or interpolated (see targets)."""
    kinds = sorted({h for h in hows if h})
    if kinds == ["refined"]:
        return "1 step (refined)"
    return "interpolated" if kinds == ["interpolated"] else "+".join(kinds)


def speedup_table(ttt: pd.DataFrame, baseline: str = "allreduce") -> pd.DataFrame:
    """The headline convergence table: rows cells, columns algorithms, each value the
    time-to-target speedup over `baseline` (mean of per-seed speedups ± the 95% t-interval's
    half-width, n seeds), marked where the cell (or the baseline's) crossed the target without
    most seeds holding it."""
    if ttt.empty:
        return pd.DataFrame()
    frame = ttt.copy()
    frame["row"] = (frame["workload"] + ", " + frame["workers"].astype(str) + " workers, "
                    + frame["slowdown"])
    frame["value"] = speedup_texts(frame, baseline, format_number)
    block = frame.pivot_table(index="row", columns="algorithm", values="value", aggfunc="first")
    block = block.reindex(columns=order_algorithms(block.columns, baseline))
    block.index.name = "cell"
    block.columns.name = None
    return block.reset_index().fillna("")


def speedup_texts(ttt: pd.DataFrame, baseline: str, fmt, plus_minus: str = "±") -> list[str]:
    """Each row's speedup as the tables show it: "2.1 ± 0.3 (n=3)", "16.9 (n=1; crossed, not
    held)", "not reached", or "" where there is nothing to compare (the baseline never got
    there). The mark goes wherever the cell's or the baseline's verdict is not "held", so no
    speedup is shown without it."""
    verdicts = {tuple(r[CELL]): r["verdict"] for _, r in ttt.iterrows()
                if r["algorithm"] == baseline}
    texts = []
    for _, row in ttt.iterrows():
        if row["verdict"] == NOT_REACHED:
            texts.append(NOT_REACHED)
            continue
        interval = Interval(row[f"speedup_vs_{baseline}"], row["speedup_low"],
                            row["speedup_high"], int(row["speedup_n"]))
        text = interval.text(fmt).replace("±", plus_minus)
        marks = []
        if row["verdict"] == NOT_HELD:
            marks.append(f"{NOT_HELD}: {row['held']} of {row['seeds']} seeds held")
        base_verdict = verdicts.get(tuple(row[CELL]))
        if row["algorithm"] != baseline and base_verdict == NOT_HELD:
            marks.append(f"{baseline} {NOT_HELD}")
        if not text:
            text = NOT_HELD if row["verdict"] == NOT_HELD else ""
            marks = [m for m in marks if not m.startswith(NOT_HELD)]
        texts.append(text + (f" [{'; '.join(marks)}]" if marks and text else ""))
    return texts


def format_number(value: float) -> str:
    """3 significant digits, without exponents for the rates and times a report shows."""
    if pd.isna(value):
        return ""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return format(value, ".3g")


def to_markdown(table: pd.DataFrame, floatfmt: str | None = None) -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency)."""
    columns = list(table.columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, row in table.iterrows():
        cells = []
        for column in columns:
            value = row[column]
            if isinstance(value, float):
                cells.append(format_number(value) if floatfmt is None
                             else "" if pd.isna(value) else format(value, floatfmt))
            else:
                # A cause or path may hold a pipe or a newline; either would break the row.
                cells.append(str(value).replace("|", "\\|").replace("\n", " "))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fact_columns(runs: pd.DataFrame) -> dict[str, dict[str, str]]:
    """{algorithm: {fact name: unit}}: the facts each algorithm's summaries declare
    (Algorithm.summary_facts and fact_units, recorded under "facts")."""
    found: dict[str, dict[str, str]] = {}
    if "facts" not in runs:
        return found
    for algorithm, facts in zip(runs["algorithm"], runs["facts"], strict=True):
        if isinstance(facts, dict):
            found.setdefault(algorithm, {}).update(facts)
    return found


def fact_label(name: str, unit: str) -> str:
    return f"{name} ({unit})" if unit else name


def facts_tables(runs: pd.DataFrame, baseline: str = "allreduce") -> dict[str, pd.DataFrame]:
    """Per algorithm with facts of its own: a table of its cells (rows) and facts (columns,
    "name (unit)"), each value the mean over the cell's ok seeds (a fact no seed recorded is
    empty)."""
    ok = runs[runs["status"] == "ok"]
    tables = {}
    declared = fact_columns(ok)
    for algorithm in order_algorithms(declared, baseline):
        facts = declared[algorithm]
        mine = ok[ok["algorithm"] == algorithm]
        values = {fact_label(name, unit): mine[name] if name in mine
                  else pd.Series(math.nan, index=mine.index) for name, unit in facts.items()}
        frame = pd.concat([mine[CELL], pd.DataFrame(values, index=mine.index)], axis=1)
        table = frame.groupby(CELL, sort=True).agg(_mean_or_first).reset_index()
        table.insert(len(CELL), "seeds", frame.groupby(CELL, sort=True).size().to_numpy())
        tables[algorithm] = table
    return tables


def _mean_or_first(values: pd.Series):
    """A fact's value over seeds: the mean of a number, the first seed's of anything else (a
    plugin may record a name or a list)."""
    numbers = pd.to_numeric(values, errors="coerce")
    if numbers.notna().any() or values.isna().all():
        return numbers.mean()
    return values.dropna().iloc[0]


def facts_by_cell(runs: pd.DataFrame) -> pd.DataFrame:
    """Every declared fact as a `fact:<name>` column per (algorithm, workload, workers,
    slowdown), mean over ok seeds: what report.csv adds after its fixed columns."""
    ok = runs[runs["status"] == "ok"]
    names = sorted({name for facts in fact_columns(ok).values() for name in facts})
    if not names:
        return pd.DataFrame(columns=KEYS)
    values = pd.DataFrame({f"fact:{name}": ok[name] for name in names if name in ok},
                          index=ok.index)
    return (pd.concat([ok[KEYS], values], axis=1).groupby(KEYS, sort=True)
            .agg(_mean_or_first).reset_index())
