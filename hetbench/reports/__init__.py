"""Reading stored results and turning them into tables and plots.

`load_runs` is the one reader of results on disk; every table and plot is a function of the
DataFrame it returns, never of live processes or of files read elsewhere.
"""

from hetbench.reports.load import load_runs

__all__ = ["load_runs"]
