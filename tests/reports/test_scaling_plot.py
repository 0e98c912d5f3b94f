"""The report's time to target against world size (issue 46): scaling-<workload>.png when a
workload ran at three or more sizes."""

import math

import pandas as pd

from hetbench.reports.plots import scaling_plots


def _ttt(sizes, algorithms=("allreduce", "dpsgd"), slowdowns=("none", "prob:5")):
    rows = []
    for workers in sizes:
        for slowdown in slowdowns:
            for algorithm in algorithms:
                missed = algorithm == "dpsgd" and workers == max(sizes)
                rows.append({"algorithm": algorithm, "workload": "mlp-clusters",
                             "workers": workers, "slowdown": slowdown,
                             "speedup_vs_allreduce": math.nan if missed else
                             (1.0 if algorithm == "allreduce" else 16 / workers)})
    return pd.DataFrame(rows)


def test_three_sizes_draw_one_figure_and_two_draw_none(tmp_path):
    (path,) = scaling_plots(_ttt([16, 64, 256]), tmp_path)
    assert path.name == "scaling-mlp-clusters.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert scaling_plots(_ttt([16, 64]), tmp_path / "none") == []
    assert scaling_plots(pd.DataFrame(), tmp_path) == []


def test_a_baseline_run_only_as_variants_is_named_with_what_to_pass():
    from hetbench.reports.notes import baseline_notes

    runs = pd.DataFrame({"algorithm": ["allreduce[network=prague/x1]",
                                       "allreduce[network=prague/tree/x1]", "dpsgd"]})
    (note,) = baseline_notes(runs, "allreduce")
    assert "No run is named allreduce" in note
    assert '--baseline "allreduce[network=prague/tree/x1]"' in note
    assert baseline_notes(runs, "allreduce[network=prague/x1]") == []
    assert baseline_notes(pd.DataFrame({"algorithm": ["allreduce", "dpsgd"]}), "allreduce") == []
    assert baseline_notes(runs, "ps-sync") == []  # absent altogether: not this note's case
