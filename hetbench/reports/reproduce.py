"""`bench reproduce prague|hop`: run the papers' matrices, then report ours beside theirs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hetbench.errors import UserError
from hetbench.reports.published import PUBLISHED, PUBLISHED_CONVERGENCE, measured_vs_published
from hetbench.reports.report import write_report
from hetbench.reports.sections import Section

#: The papers' matrices, shipped with the package (pyproject's package-data), so that
#: `bench reproduce` runs from an installed wheel as from a checkout.
MATRIX_DIR = Path(__file__).resolve().parent / "matrices"

PUBLISHED_TEXT = (
    "Published ratios beside ours: the Prague slides and abstract (Luo et al., 'Prague: "
    "High-Performance Heterogeneity-Aware Asynchronous Decentralized Training', ASPLOS 2020), "
    "the Ripples abstract (Luo et al., 'Heterogeneity-Aware Asynchronous Decentralized Training', "
    "arXiv 2019) and Hop (Luo et al., 'Hop: Heterogeneity-Aware "
    "Decentralized Training', ASPLOS 2019). We "
    "reproduce the shape on this machine, not the GPU cluster's absolute numbers: `shape` is "
    "'same' when ours falls on the same side of 1 as theirs (on par = within 5% of 1). A "
    "published speedup is measured as time-to-target speedup where the runs evaluated "
    "convergence, else as a throughput ratio (emulated compute); `measured as` says which.")


CONVERGENCE_TEXT = (
    " Convergence: real compute on real images (scikit-learn's digits, upscaled; a narrow "
    "VGG-16 and Hop's small CNN), every speedup the time the averaged model took to reach the "
    "target; only the published figures on the workloads trained here are listed (the "
    "throughput rows are `bench reproduce NAME [--emulate]`'s). docs/convergence.md says what "
    "is reproduced at what scale.")


EMULATED_TEXT = (
    " Emulated: every run played the paper's cluster as the network preset models it (links, "
    "nodes, NIC queues; assumptions in docs/network.md and the matrix file), its times in "
    "cluster seconds; a run the host could not keep up with is marked low fidelity.")


def matrix_path(name: str, quick: bool, matrix_dir: Path = MATRIX_DIR,
                emulate: bool = False, convergence: bool = False) -> Path:
    """hetbench/reports/matrices/reproduce-<name>[-emulated|-convergence][-quick].toml."""
    if name not in PUBLISHED:
        raise UserError(f"unknown reproduction {name!r}; choose one of: {', '.join(PUBLISHED)}")
    if emulate and convergence:
        raise UserError("--emulate and --convergence are separate reproductions (emulated "
                        "compute measures no convergence); pick one")
    kind = "-emulated" if emulate else "-convergence" if convergence else ""
    path = matrix_dir / f"reproduce-{name}{kind}{'-quick' if quick else ''}.toml"
    if not path.is_file():
        raise UserError(f"{path} is missing: this installation of hetbench is incomplete "
                        "(reinstall it)")
    return path


def check_available(algorithms: list[str], name: str) -> None:
    """One clear line if any algorithm the reproduction needs cannot be imported here."""
    from hetbench.core.registry import ALGORITHMS

    for algorithm in algorithms:
        try:
            ALGORITHMS.get(algorithm)
        except UserError as exc:
            reason = str(exc).split(": ", 1)[-1]
            raise UserError(f"`bench reproduce {name}` needs algorithm {algorithm!r}, which is "
                            f"unavailable here ({reason}); see `bench list`") from None


def figures_for(name: str, convergence: bool, workloads: set[str]) -> list:
    """The published figures a reproduction of `name` measures: the throughput tables' and
    abstracts' (all of them, so a row not run says so), or with `convergence` the convergence
    claims on the workloads the matrix trains."""
    if not convergence:
        return PUBLISHED[name]
    return [fig for fig in PUBLISHED_CONVERGENCE[name] if fig.workload in workloads]


def coverage(name: str, configs, convergence: bool = False) -> list[tuple[str, str]]:
    """Each published figure the reproduction measures (figures_for) and whether the matrix's
    runs can measure it: (figure, 'covered' or why not)."""
    runs = {(c.algorithm, c.workload, c.slowdown) for c in configs}
    workloads = {c.workload for c in configs}
    rows = []
    for fig in figures_for(name, convergence, workloads):
        label = (f"{fig.source}: {fig.algorithm} / {fig.reference} ({fig.ref_slowdown}) on "
                 f"{fig.workload}, {fig.slowdown}")
        missing = [f"{a} {w} {sl}" for a, w, sl in [(fig.algorithm, fig.workload, fig.slowdown),
                                                   (fig.reference, fig.workload,
                                                    fig.ref_slowdown)]
                   if (a, w, sl) not in runs]
        if not missing:
            rows.append((label, "covered"))
        elif fig.workload not in workloads:
            rows.append((label, f"not run: no {fig.workload} runs in the matrix"))
        else:
            rows.append((label, f"not run: no {', '.join(missing)} run"))
    return rows


def reproduce(name: str, quick: bool, out: Path | None, force: bool = False,
              echo: Callable[[str], None] = print,
              matrix_dir: Path = MATRIX_DIR, emulate: bool = False, dry_run: bool = False,
              convergence: bool = False) -> tuple[dict[str, Path], int]:
    """Run the reproduction matrix (on the paper's emulated cluster with `emulate`; the
    real-compute convergence matrix with `convergence`) and write its report; returns (paths,
    failed run count). `dry_run`: list the runs and which published figures they cover, run
    nothing (returns ({}, 0))."""
    from hetbench.harness.matrix import expand, load_matrix_file
    from hetbench.harness.runner import run_matrix
    from hetbench.reports.targets import targets_from_matrix

    spec = load_matrix_file(matrix_path(name, quick, matrix_dir, emulate, convergence))
    check_available(list(spec.get("algorithms", [])), name)
    targets = targets_from_matrix(spec)
    configs = expand(spec)
    out = out or Path("results") / str(spec["name"])
    if dry_run:
        for config in configs:
            echo(f"{config.run_id}  {config.label()}")
        rows = coverage(name, configs, convergence)
        covered = sum(status == "covered" for _, status in rows)
        echo(f"published figures: {covered} of {len(rows)} covered by these "
             f"{len(configs)} run(s)")
        for label, status in rows:
            echo(f"  {status:9s}  {label}" if status == "covered" else f"  {label}: {status}")
        return {}, 0
    echo(f"{len(configs)} run(s) of {spec['name']} -> {out}")
    failed = 0

    def on_done(outcome) -> None:
        nonlocal failed
        s, label = outcome.summary, outcome.config.label()
        if outcome.skipped:
            echo(f"skip {label}: already finished")
        elif s["status"] == "ok":
            echo(f"ok   {label}: {s['throughput']:.1f} samples/s ({s['wall_s']:.1f} s)")
        else:
            failed += 1
            echo(f"FAIL {label}: {s['cause']}")

    run_matrix(configs, out, force=force, on_done=on_done)

    tables = []

    def published_section(report) -> list[Section]:
        figures = figures_for(name, convergence, {c.workload for c in configs})
        table = measured_vs_published(figures, report.throughput, report.time_to_target)
        tables.append(table)
        text = PUBLISHED_TEXT + (EMULATED_TEXT if emulate else "") + (
            CONVERGENCE_TEXT if convergence else "")
        return [Section("Published vs measured", text, table)]

    paths = write_report(out, "allreduce" if name == "prague" else "dpsgd", targets,
                         extra=published_section)
    paths["published_csv"] = out / "published_vs_measured.csv"
    tables[0].to_csv(paths["published_csv"], index=False)
    return paths, failed
