"""Reading stored results and turning them into tables and plots.

`load_runs` is the one reader of results on disk; every table and plot is a function of the
DataFrames it and `load_evals` return, never of live processes or of files read elsewhere.

    load.py       load_runs / load_evals / load_events / load_env; old schemas upgraded on load
    targets.py    convergence targets and time to target
    tables.py     throughput (flat and Prague-slides layout), time to target, markdown
    plots.py      seaborn convergence plots;  timeline.py  per-worker Gantt of one run
    trace.py      timeline.json: a whole run as Chrome trace events (Perfetto)
    waits.py      who waited for whom, from the event logs;  tensorboard.py  bench export
    sections.py   the sections report.md and report.html share, and their two renderers
    html.py       the self-contained report.html;  report.py  `bench report` (all of the above)
    compare.py    `bench compare`;  published.py + reproduce.py  `bench reproduce`
"""

from hetbench.reports.load import load_evals, load_events, load_runs

__all__ = ["load_evals", "load_events", "load_runs"]
