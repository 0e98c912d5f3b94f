"""Tolerance curves: severity sweeps found in a matrix's slowdowns, and the report's section."""

from __future__ import annotations

import math

import pytest

from hetbench.core.config import RunConfig
from hetbench.reports.report import write_report
from hetbench.reports.tolerance import find_sweeps
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import simulate


def test_sweeps_are_specs_that_differ_in_one_number():
    sweeps = find_sweeps(["none", "prob:2", "prob:5", "prob:10", "det:3@0", "prob:3@0.5",
                          "compose:persistent(frac=0.1;k=1.1)",
                          "compose:persistent(frac=0.1;k=2)", "preset:osdi-p50",
                          "preset:osdi-p90", "preset:osdi-p99", "det:2@1", "det:4@2"])
    by_template = {s.template: s.severity for s in sweeps}
    assert by_template["prob:K"] == {"prob:2": 2, "prob:5": 5, "prob:10": 10}
    assert by_template["compose:persistent(frac=#;k=K)"] == {
        "compose:persistent(frac=0.1;k=1.1)": 1.1, "compose:persistent(frac=0.1;k=2)": 2}
    assert by_template["preset:osdi-pK"] == {"preset:osdi-p50": 50, "preset:osdi-p90": 90,
                                              "preset:osdi-p99": 99}
    # det:2@1 and det:4@2 differ in two numbers (factor and worker): not one severity.
    assert not any(t.startswith("det") for t in by_template)
    assert find_sweeps(["none", "prob:5"]) == []


def test_a_severity_sweep_gets_a_table_and_figure_in_its_report(tmp_path):
    models = SimModels(NetworkModel(alpha_s=1e-5, beta_bytes_per_s=1e10), ComputeModel())
    for algorithm in ("allreduce", "hop"):
        for slowdown in ("none", "prob:2", "prob:5", "prob:10"):
            config = RunConfig(algorithm=algorithm, workload="mlp-digits", workers=8,
                               slowdown=slowdown, iterations=60, pace_ms=20, matrix="tol")
            assert simulate(config, models, tmp_path).summary["status"] == "ok"
    paths = write_report(tmp_path)
    assert (tmp_path / "tolerance.png").stat().st_size > 0
    markdown = paths["md"].read_text()
    assert "## Tolerance to stragglers" in markdown and "](tolerance.png)" in markdown
    # The section's table, read back from the markdown: allreduce against itself is 1, and
    # its throughput falls, relative to its unslowed run, as K grows.
    section = markdown.split("## Tolerance to stragglers", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines()
            if line.startswith("| mlp-digits")]
    header = [c.strip() for c in next(line for line in section.splitlines()
                                      if line.startswith("| workload")).strip("|").split("|")]
    table = [dict(zip(header, (c.strip() for c in row), strict=True)) for row in rows]
    allreduce = [r for r in table if r["algorithm"] == "allreduce"]
    assert [float(r["severity"]) for r in allreduce] == [2, 5, 10]
    assert all(float(r["vs_allreduce"]) == pytest.approx(1.0) for r in allreduce)
    own = [float(r["vs_own_none"]) for r in allreduce]
    assert own[0] > own[1] > own[2] and own[2] < 0.5
    hop = [r for r in table if r["algorithm"] == "hop"]
    assert len(hop) == 3 and all(not math.isnan(float(r["vs_own_none"])) for r in hop)


def test_a_matrix_without_a_sweep_gets_no_tolerance_section(tmp_path):
    models = SimModels(NetworkModel(alpha_s=1e-5, beta_bytes_per_s=1e10), ComputeModel())
    for slowdown in ("none", "prob:5"):
        config = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=4,
                           slowdown=slowdown, iterations=30, pace_ms=20)
        simulate(config, models, tmp_path)
    paths = write_report(tmp_path)
    assert "Tolerance" not in paths["md"].read_text()
    assert not (tmp_path / "tolerance.png").exists()
