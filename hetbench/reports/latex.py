"""report.tex: the headline tables as LaTeX (booktabs), for a paper.

Two tables, rows the cells (workload, workers, slowdown) and columns the algorithms: throughput
over the baseline, and time-to-target speedup over it. Each value is the mean over seeds of the
per-seed ratio (each seed against the baseline's run of the same seed) with its 95% Student-t
interval's half-width and n, the same numbers report.md and report.html show. Marks a reader
must see travel with the number: a cell that synchronized markedly less than its protocol
intends, and one that crossed the target without most seeds holding it. `\\input{report.tex}`
needs `\\usepackage{booktabs}`.
"""

from __future__ import annotations

import math

import pandas as pd

from hetbench.reports.intervals import Interval
from hetbench.reports.tables import CELL, order_algorithms, speedup_texts
from hetbench.reports.targets import NOT_HELD, NOT_REACHED

LOW_SYNC_MARK = r"$^\dagger$"
NOT_HELD_MARK = r"$^\ddagger$"
_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
            "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
            "^": r"\textasciicircum{}"}


def escape(text: str) -> str:
    """Text as LaTeX typesets it (a target's ">=" as a relation, not two characters)."""
    text = "".join(_SPECIAL.get(c, c) for c in str(text))
    return text.replace(">=", r"$\geq$").replace("<=", r"$\leq$")


def number(value: float) -> str:
    """3 significant digits, as the markdown tables show them."""
    if value is None or math.isnan(value):
        return ""
    return f"{value:,.0f}" if abs(value) >= 1000 else format(value, ".3g")


def interval_tex(interval: Interval) -> str:
    """`$1.23 \\pm 0.04$ (3)`: the mean, the half-width where n >= 2, n in parentheses."""
    if interval.n == 0 or math.isnan(interval.mean):
        return ""
    if math.isnan(interval.low):
        return f"${number(interval.mean)}$ ({interval.n})"
    return f"${number(interval.mean)} \\pm {number(interval.half_width)}$ ({interval.n})"


def _tabular(rows: dict[tuple, dict[str, str]], algorithms: list[str], caption: str,
             notes: list[str]) -> str:
    columns = "lrl" + "c" * len(algorithms)
    head = " & ".join(["workload", "workers", "slowdown", *(escape(a) for a in algorithms)])
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             f"\\begin{{tabular}}{{{columns}}}", r"\toprule", head + r" \\", r"\midrule"]
    for (workload, workers, slowdown), values in rows.items():
        cells = [escape(workload), str(workers), escape(slowdown),
                 *(values.get(a, "") or "--" for a in algorithms)]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines.append(f"\\caption{{{caption}{' ' if notes else ''}{' '.join(notes)}}}")
    lines.append(r"\end{table}")
    return "\n".join(lines)


def throughput_tex(throughput: pd.DataFrame, baseline: str) -> str:
    """Throughput over the baseline in the same cell (per-seed ratios)."""
    rows: dict[tuple, dict[str, str]] = {}
    marked = False
    for _, r in throughput.sort_values(CELL).iterrows():
        if r["ratio_n"]:
            text = interval_tex(Interval(r["ratio_mean"], r["ratio_low"], r["ratio_high"],
                                         int(r["ratio_n"])))
        else:  # no seed in common with the baseline's runs: the ratio of the means
            text = f"${number(r[f'throughput_vs_{baseline}'])}$"
        if r.get("sync_flag"):
            text += LOW_SYNC_MARK
            marked = True
        rows.setdefault(tuple(r[CELL]), {})[r["algorithm"]] = text
    notes = [f"{LOW_SYNC_MARK} averaged with a peer markedly less often than its protocol "
             "intends: its throughput is not comparable."] if marked else []
    return _tabular(rows, order_algorithms(throughput["algorithm"].unique(), baseline),
                    f"Throughput over {escape(baseline)} in the same cell: mean over seeds of "
                    f"each seed's ratio to {escape(baseline)}'s run of that seed $\\pm$ the 95\\% "
                    "Student-t interval's half-width (number of seeds).", notes)


def speedup_tex(ttt: pd.DataFrame, baseline: str) -> str:
    """Time-to-target speedup over the baseline, with the crossed-not-held mark."""
    rows: dict[tuple, dict[str, str]] = {}
    marked = False
    texts = speedup_texts(ttt, baseline, number)  # for the marks, computed as the md has them
    for (_, r), shown in zip(ttt.iterrows(), texts, strict=True):
        if r["verdict"] == NOT_REACHED:
            text = "not reached"
        else:
            text = interval_tex(Interval(r[f"speedup_vs_{baseline}"], r["speedup_low"],
                                         r["speedup_high"], int(r["speedup_n"])))
            if NOT_HELD in shown:
                text = (text or "crossed") + NOT_HELD_MARK
                marked = True
        rows.setdefault(tuple(r[CELL]), {})[r["algorithm"]] = text
    notes = [f"{NOT_HELD_MARK} crossed the target but most seeds (of it or of "
             f"{escape(baseline)}) did not hold it to the end of the run: not a result."
             ] if marked else []
    target = "; ".join(escape(t) for t in sorted(ttt["target"].unique()))
    return _tabular(rows, order_algorithms(ttt["algorithm"].unique(), baseline),
                    f"Time-to-target speedup over {escape(baseline)} ({target}): mean over seeds "
                    f"of {escape(baseline)}'s time over this time, each seed against "
                    f"{escape(baseline)}'s run of that seed, $\\pm$ the 95\\% Student-t "
                    "interval's half-width (number of seeds). A cell reaches the target when "
                    "most of its seeds held it.", notes)


def report_tex(throughput: pd.DataFrame, ttt: pd.DataFrame, baseline: str) -> str:
    parts = ["% hetbench report: \\usepackage{booktabs}", throughput_tex(throughput, baseline)]
    if not ttt.empty:
        parts.append(speedup_tex(ttt, baseline))
    return "\n\n".join(parts) + "\n"
