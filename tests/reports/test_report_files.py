"""`bench report`, `bench compare` and `bench reproduce` on the checked-in fixtures."""

import base64
import csv
import io
import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from hetbench.errors import UserError
from hetbench.reports import load_runs
from hetbench.reports.compare import Interval, compare_frame, ratio
from hetbench.reports.load import load_evals
from hetbench.reports.published import PRAGUE, PUBLISHED, Published, measured_vs_published
from hetbench.reports.report import write_report
from hetbench.reports.reproduce import check_available, matrix_path
from hetbench.reports.targets import Target
from hetbench.reports.timeline import choose_run
from tests.helpers import SLOW_VARIANT_CASES, skip_unless_today

from .conftest import RESULTS


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_write_report_writes_every_file(results):
    paths = write_report(results, targets={"mlp-digits": Target("accuracy", 0.6)})
    names = {p.name for p in paths.values()}
    assert {"report.csv", "report.md", "report.html", "report.tex", "time_to_target.csv",
            "timeline.png",
            "timeline.json", "waits.csv", "waits.png", "convergence-mlp-digits-w2-time.png",
            "convergence-mlp-digits-w2-iterations.png", "headline.png"} == names
    for path in paths.values():
        assert path.is_file() and path.stat().st_size > 0
    with paths["csv"].open() as f:
        header = next(csv.reader(f))
    assert header[:6] == ["algorithm", "workload", "workers", "slowdown", "throughput",
                          "throughput_vs_allreduce"]
    md = paths["md"].read_text()
    assert "### slowdown: prob:3" in md and "### slowdown: none" in md
    assert "## Runs not ok" in md and "det:200@1" not in md.split("## Runs not ok")[0]
    assert "Timed out" in md  # the failed run's cause
    assert "Pacing on: a floor of 10 ms" in md
    assert "Target for mlp-digits: test accuracy >= 0.6 (from --target)" in md
    ttt = pd.read_csv(paths["time_to_target_csv"]).set_index(["algorithm", "slowdown"])
    # The fixtures' evaluations: below 0.6 at 0.4 s, above at 0.5 s; interpolated in between.
    assert 0.4 < ttt.loc[("allreduce", "none"), "time_to_target_s"] <= 0.5
    assert ttt.loc[("allreduce", "none"), "resolution"] == "interpolated"


@pytest.fixture(scope="module")
def default_report(tmp_path_factory):
    """write_report's paths for a copy of the fixtures with no options (made once; the tests
    that use it only read it)."""
    copy = tmp_path_factory.mktemp("default-report") / "results"
    shutil.copytree(RESULTS, copy)
    return write_report(copy)


def test_html_is_self_contained_with_every_image(default_report):
    paths = default_report
    page = paths["html"].read_text()
    images = re.findall(r'<img(?: id="\w+")? src="data:image/png;base64,([A-Za-z0-9+/=]+)"',
                        page)
    pngs = [p for p in paths.values() if p.suffix == ".png"]
    assert len(images) == len(pngs) == 5
    for data in images:
        width, height = png_size(base64.b64decode(data))
        assert width > 100 and height > 100
    # Self-contained: nothing fetched; its one script is inline (sorting tables).
    assert "src=\"http" not in page and "<script src" not in page and "<link" not in page
    assert page.count("<script>") == 1
    assert page.count("<table") >= 5  # 2 Prague blocks, throughput, time to target, metadata
    env = json.loads(next(RESULTS.glob("allreduce-*-none-*/env.json")).read_text())
    assert env["git_sha"][:10] in page and env["torch"] in page and env["hostname"] in page


def test_timeline_default_is_the_baseline_run_with_most_slowdown():
    runs = load_runs(RESULTS)
    run = choose_run(runs)
    ok_allreduce = runs[(runs["algorithm"] == "allreduce") & (runs["status"] == "ok")]
    assert run["run_id"] == ok_allreduce.loc[ok_allreduce["slowdown_s"].idxmax(), "run_id"]
    assert run["slowdown"] == "prob:3"
    assert choose_run(runs, wanted="ps-async-mlp-digits-w2-none")["algorithm"] == "ps-async"
    with pytest.raises(UserError, match="matches 2 runs"):
        choose_run(runs, wanted="ps-async-mlp-digits-w2-prob")


def test_compare_marks_what_the_seeds_do_not_support():
    runs = load_runs(RESULTS)
    evals = load_evals(runs)
    frame = compare_frame(runs, evals, "allreduce", {"mlp-digits": Target("accuracy", 0.6)})
    frame = frame.set_index("slowdown")
    one_seed = frame.loc["none"]
    assert one_seed["throughput_note"] == "unsupported: 1 seed"
    assert math.isnan(one_seed["throughput_low"])
    two = frame.loc["prob:3"]
    tp = runs[runs["slowdown"] == "prob:3"].groupby("algorithm")["throughput"]
    a, b = Interval.of(tp.get_group("ps-async")), Interval.of(tp.get_group("allreduce"))
    assert two["throughput_ratio"] == pytest.approx(a.mean / b.mean)
    assert two["throughput_low"] == pytest.approx(a.low / b.high)
    assert two["seeds"] == 2 and two["baseline_seeds"] == 2
    overlap = a.low <= b.high and b.low <= a.high
    assert (two["throughput_note"] == "unsupported: intervals overlap") == overlap
    # allreduce reached 0.6 at 1.0 s with both seeds; ps-async at 0.5 s and 0.7 s: the
    # interpolated times fall a little before those evaluations (within 0.1 s of each).
    assert 0.5 / 1.0 < two["time_to_target_ratio"] < 0.6 / 0.9


def test_ratio_support_rule():
    apart = ratio(Interval(10, 9, 11, 3), Interval(5, 4, 6, 3))
    assert apart[0] == 2 and apart[3] == ""
    assert apart[1] == pytest.approx(9 / 6) and apart[2] == pytest.approx(11 / 4)
    assert ratio(Interval(10, 5, 15, 3), Interval(9, 7, 11, 3))[3] == (
        "unsupported: intervals overlap")
    assert ratio(Interval(10, 5, 15, 3), Interval(9, math.nan, math.nan, 1))[3] == (
        "unsupported: 1 seed")
    interval = Interval.of([1.0, 2.0, 3.0])
    # t(0.975, 2) = 4.303; sd = 1; half width = 4.303 / sqrt(3)
    assert interval.high - interval.mean == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)


def test_published_vs_measured_places_ours_beside_theirs():
    throughput = pd.DataFrame([
        {"algorithm": "allreduce", "workload": "resnet18", "workers": 16, "slowdown": "none",
         "throughput": 100.0},
        {"algorithm": "prague-smart", "workload": "resnet18", "workers": 16, "slowdown": "none",
         "throughput": 90.0},
        {"algorithm": "allreduce", "workload": "resnet18", "workers": 16, "slowdown": "prob:5",
         "throughput": 30.0},
    ])
    table = measured_vs_published(PRAGUE, throughput, pd.DataFrame())
    smart = table[(table["source"] == "Prague slides") & (table["algorithm"] == "prague-smart")
                  & (table["workload"] == "resnet18") & (table["slowdown"] == "none")].iloc[0]
    assert smart["published"] == "1.1" and smart["measured"] == pytest.approx(0.9)
    assert smart["shape"] == "differs"  # theirs above 1, ours below
    slowed = table[(table["algorithm"] == "allreduce") & (table["slowdown"] == "prob:5")].iloc[0]
    assert slowed["measured"] == pytest.approx(0.3) and slowed["shape"] == "same"
    assert slowed["vs"] == "allreduce (none)"
    resnet200 = table[table["workload"] == "resnet200"]
    assert (resnet200["measured as"] == "not run").all() and resnet200["measured"].isna().all()
    qualitative = measured_vs_published(
        [Published("Hop", "prague-smart", "allreduce", "resnet18", "none", "speedup", None)],
        throughput, pd.DataFrame()).iloc[0]
    assert qualitative["published"] == "> 1 (significant)" and qualitative["shape"] == "differs"


def test_reproduce_fails_in_one_line_when_an_algorithm_is_unavailable(monkeypatch):
    from hetbench.core.registry import ALGORITHMS

    ALGORITHMS.names()  # load plugins first, so the patch below is not overwritten
    monkeypatch.setitem(ALGORITHMS._targets, "not-landed", "hetbench.algorithms.not_landed:X")
    with pytest.raises(UserError) as info:
        check_available(["allreduce", "not-landed"], "prague")
    message = str(info.value)
    assert "\n" not in message and "'not-landed'" in message and "bench list" in message
    with pytest.raises(UserError, match="unknown reproduction"):
        matrix_path("ripples", quick=False)


@pytest.mark.parametrize("name", ["prague", "hop"])
@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("kind", ["throughput", "emulate", "convergence"])
def test_reproduce_matrices_expand(name, quick, kind):
    from hetbench.harness.matrix import expand, load_matrix_file
    from hetbench.reports.published import PUBLISHED, PUBLISHED_CONVERGENCE
    from hetbench.reports.targets import targets_from_matrix

    emulate, convergence = kind == "emulate", kind == "convergence"
    spec = load_matrix_file(matrix_path(name, quick, emulate=emulate, convergence=convergence))
    try:
        configs = expand(spec)
    except UserError as exc:
        if "unavailable" in str(exc):
            pytest.skip(f"an algorithm has not landed yet: {exc}")
        raise
    targets = targets_from_matrix(spec)
    algorithms = {c.algorithm for c in configs}
    # Every algorithm of a published figure on a workload we run is in the matrix.
    workloads = {c.workload for c in configs}
    for fig in (PUBLISHED_CONVERGENCE if convergence else PUBLISHED)[name]:
        if fig.workload in workloads:
            assert {fig.algorithm, fig.reference} <= algorithms
    if convergence:
        # Real compute on real images, timed to a target: what a convergence figure needs.
        assert {c.compute for c in configs} == {"real"} and targets
        assert {c.data_source for c in configs} == {"scikit-learn digits, upscaled to 32x32x3"}
        assert all(c.pace_ms > 0 for c in configs)
    elif name == "prague":
        assert {c.compute for c in configs} == {"emulated"}
    if kind == "throughput":  # the papers ran one slowdown rate: ours sweep it (tolerance.png)
        from hetbench.reports.tolerance import find_sweeps

        (sweep,) = find_sweeps({c.slowdown for c in configs})
        assert sweep.template == "prob:K" and len(sweep.severity) >= 2
    # --emulate plays the paper's own preset, dilated; without it, no network model.
    presets = {c.network.get("preset") for c in configs}
    assert presets == ({name} if emulate else {None})
    assert all(c.dilation > 1 for c in configs) == emulate


@pytest.mark.slow
def test_reproduce_convergence_covers_its_figures_and_is_not_emulated(bench):
    listed = bench("reproduce", "prague", "--convergence", "--quick", "--dry-run")
    assert listed.returncode == 0, listed.stderr
    assert "published figures: 5 of 5 covered by these 8 run(s)" in listed.stdout
    assert "resnet18" not in listed.stdout  # the throughput rows are another reproduction's
    both = bench("reproduce", "hop", "--convergence", "--emulate", "--dry-run")
    assert both.returncode == 2 and both.stderr.count("\n") == 1
    assert "pick one" in both.stderr


@pytest.mark.slow
def test_cli_compare_and_report_on_fixtures(results, bench):
    skip_unless_today("compare-and-report-fixtures", SLOW_VARIANT_CASES, per_day=4)
    compared = bench("compare", str(results), "--target",
                         "accuracy:0.6")
    assert compared.returncode == 0, compared.stderr
    lines = [line for line in compared.stdout.splitlines() if line.startswith("| ps-async")]
    assert len(lines) == 2 and "unsupported: 1 seed" in lines[0]
    assert re.search(r"\| prob:3 \| 2 vs 2 \| [0-9.]+ \[[0-9.]+, [0-9.]+\]", lines[1])
    reported = bench("report", str(results), "--timeline",
                         "ps-async-mlp-digits-w2-none")
    assert reported.returncode == 0, reported.stderr
    assert "Timeline of run ps-async-mlp-digits-w2-none-s1-" in (results / "report.md").read_text()
    bad = bench("report", str(results), "--target", "speed:2")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("error: target 'speed:2'")
    baseline = bench("compare", str(results), "--baseline", "hop")
    assert baseline.returncode == 2 and "pick one with --baseline" in baseline.stderr


def test_report_csv_parses_back(default_report):
    paths = default_report
    frame = pd.read_csv(io.StringIO(paths["csv"].read_text()))
    assert set(frame["algorithm"]) == {"allreduce", "ps-async"}
    assert (frame[frame["algorithm"] == "allreduce"]["throughput_vs_allreduce"] == 1.0).all()


def test_spread_row_only_where_final_models_differ(tmp_path):
    from hetbench.reports.plots import DPI, convergence_plots

    evals = load_evals(load_runs(RESULTS))
    (both, _) = convergence_plots(evals, tmp_path)
    assert png_size(both.read_bytes())[1] == 9 * DPI  # ps-async's workers end apart: 3 rows
    only_allreduce = tmp_path / "allreduce"
    only_allreduce.mkdir()
    (path, _) = convergence_plots(evals[evals["algorithm"] == "allreduce"], only_allreduce)
    assert png_size(path.read_bytes())[1] == 6 * DPI  # identical final models: 2 rows


def test_simulated_runs_are_flagged(results):
    assert not load_runs(results)["simulated"].any()
    path = next(results.glob("ps-async-mlp-digits-w2-none-*/summary.json"))
    summary = json.loads(path.read_text())
    path.write_text(json.dumps({**summary, "simulated": True}))
    runs = load_runs(results)
    assert runs["simulated"].sum() == 1
    md = write_report(results)["md"].read_text()
    assert "Simulated (`bench sim`" in md and "1 of 7 run(s)" in md


def test_compare_says_when_a_mean_time_leaves_out_seeds_that_never_got_there():
    runs = load_runs(RESULTS)
    frame = compare_frame(runs, load_evals(runs), "allreduce",
                          {"mlp-digits": Target("accuracy", 0.7)}).set_index("slowdown")
    # allreduce seed 2 under prob:3 peaks at 0.649 (fixture eval.jsonl): only seed 1 counts.
    assert frame.loc["prob:3", "time_to_target_note"] == (
        "unsupported: 1 seed; reached by allreduce 1 of 2 seeds")


@pytest.mark.slow
def test_reproduce_dry_run_lists_the_runs_and_the_published_figures_they_cover(bench, tmp_path):
    emulated = bench("reproduce", "prague", "--emulate", "--dry-run", "--out", str(tmp_path))
    assert emulated.returncode == 0, emulated.stderr
    total = len(PUBLISHED["prague"])
    assert f"published figures: {total} of {total} covered" in emulated.stdout
    assert "prague-smart transformer w=16 none" in emulated.stdout
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written
    # The quick matrix runs ResNet-18 only: the other figures say why they are not measured.
    quick = bench("reproduce", "prague", "--quick", "--dry-run", "--out", str(tmp_path))
    assert quick.returncode == 0, quick.stderr
    assert "not run: no resnet200 runs in the matrix" in quick.stdout
    assert f"of {total} covered" in quick.stdout and f"{total} of {total}" not in quick.stdout


def test_a_report_reads_each_run_file_once(results, tmp_path, monkeypatch):
    # The scan, the waits, the timeline and the trace all read event logs, and the scan and the
    # waits each run's config and summary; within the report each file is read from disk once,
    # and the report is the one each reader's own read gave.
    import contextlib

    import hetbench.core.record as record
    import hetbench.reports.report as report_module
    from hetbench.cli.report import _scan
    from hetbench.core.record import runs_read_once

    alone = tmp_path / "alone"
    shutil.copytree(RESULTS, alone)
    with monkeypatch.context() as no_scope:  # every reader reads the logs itself
        no_scope.setattr(report_module, "runs_read_once", contextlib.nullcontext)
        write_report(alone, scan=_scan(alone, events=True))

    reads: dict[str, int] = {}
    real = record.read_jsonl

    def counted(path):
        if path.name.startswith("events.rank"):
            reads[str(path)] = reads.get(str(path), 0) + 1
        return real(path)

    json_reads: dict[str, int] = {}
    read_text = Path.read_text

    def counted_text(path, *args, **kwargs):
        if path.name in ("config.json", "summary.json") or path.name.startswith("done.rank"):
            json_reads[str(path)] = json_reads.get(str(path), 0) + 1
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(record, "read_jsonl", counted)
    monkeypatch.setattr(Path, "read_text", counted_text)
    with runs_read_once():
        paths = write_report(results, scan=_scan(results, events=True))
    monkeypatch.undo()
    assert reads and set(reads.values()) == {1}
    assert {Path(p).name for p in json_reads} >= {"config.json", "summary.json"}
    assert set(json_reads.values()) == {1}, json_reads
    assert "timeline" in paths and "trace" in paths  # the readers after the scan did run
    for name in ("report.csv", "waits.csv", "timeline.json", "time_to_target.csv"):
        assert (results / name).read_bytes() == (alone / name).read_bytes(), name
