"""CLI commands that read stored results: `bench report`, `bench compare`, `bench reproduce`.

Each is a click command appended to COMMANDS; hetbench.cli.main adds them to the `bench` group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hetbench.cli.flags import lock_results, plugin_flag, wait_flag
from hetbench.core.lock import make_results_dir

TARGET_HELP = ("Convergence target: accuracy:V or loss:V for every workload, or "
               "WORKLOAD=accuracy:V; repeatable. Default: the matrix's, else picked from the runs.")


def _targets(target: tuple[str, ...], matrix: Path | None, results_dir: Path):
    """--target values over the matrix's `target` (--matrix, else the matrix.json that
    `bench run` stored in the results directory), which is over none."""
    from hetbench.core.store import read_json
    from hetbench.reports.targets import parse_targets, targets_from_matrix

    found = {}
    if matrix is not None:
        from hetbench.harness.matrix import load_matrix_file

        found.update(targets_from_matrix(load_matrix_file(matrix)))
    elif (results_dir / "matrix.json").is_file():
        try:
            stored = read_json(results_dir / "matrix.json")
        except (OSError, ValueError) as exc:
            click.echo(f"warning: {results_dir / 'matrix.json'} is unreadable ({exc}); its "
                       "target is not used", err=True)
        else:
            found.update(targets_from_matrix(stored))
    found.update(parse_targets(target))
    return found


def _scan(results_dir: Path, events: bool):
    """The runs under `results_dir` a reader can use; one warning line on stderr per run it
    skips (unreadable) or reads with lines skipped, and one for runs still in progress."""
    from hetbench.errors import UserError
    from hetbench.reports.load import scan_runs

    if not results_dir.is_dir():
        raise UserError(f"results directory {results_dir} does not exist; run `bench run` first")
    scan = scan_runs(results_dir, events=events)
    for line in scan.warnings():
        click.echo(f"warning: {line}", err=True)
    if note := scan.progress_note():
        click.echo(f"note: {note}", err=True)
    return scan


@click.command("report")
@click.argument("results_dir", type=click.Path(path_type=Path))
@click.option("--baseline", default="allreduce", show_default=True,
              help="Algorithm that throughput and time to target are normalised to.")
@click.option("--target", multiple=True, help=TARGET_HELP)
@click.option("--matrix", type=click.Path(path_type=Path),
              help="Matrix file whose `target` to use (default: the one `bench run` stored).")
@click.option("--timeline", "timeline_run",
              help="Run id (or unique prefix) to draw the per-worker timeline of. Default: the "
                   "baseline's run with the most injected slowdown.")
@plugin_flag
def report_cmd(results_dir: Path, baseline: str, target: tuple[str, ...], matrix: Path | None,
               timeline_run: str | None) -> None:
    """Write report.md/.csv/.html, time-to-target, convergence plots and a timeline."""
    from hetbench.core.record import runs_read_once
    from hetbench.reports.report import write_report

    with runs_read_once():  # the scan's read of every event log serves the report too
        scan = _scan(results_dir, events=True)
        paths = write_report(results_dir, baseline, _targets(target, matrix, results_dir),
                             timeline_run, scan=scan)
    for kind, path in paths.items():
        click.echo(f"{kind}: {path}")
    if "timeline" not in paths:
        click.echo("warning: no timeline: no ok run kept its event lines (a simulation above "
                   "64 workers keeps one record per worker; a stored study may leave them out)",
                   err=True)


@click.command("compare")
@click.argument("results_dir", type=click.Path(path_type=Path))
@click.option("--baseline", default="allreduce", show_default=True,
              help="Algorithm every other one is compared with.")
@click.option("--target", multiple=True, help=TARGET_HELP)
@click.option("--matrix", type=click.Path(path_type=Path),
              help="Matrix file whose `target` to use.")
@plugin_flag
def compare_cmd(results_dir: Path, baseline: str, target: tuple[str, ...],
                matrix: Path | None) -> None:
    """Throughput and time-to-target ratios vs a baseline, with the spread over seeds."""
    from hetbench.errors import UserError
    from hetbench.reports.compare import CONFIDENCE, compare_frame, compare_markdown
    from hetbench.reports.report import build_report

    scan = _scan(results_dir, events=False)
    report = build_report(results_dir, baseline, _targets(target, matrix, results_dir), scan)
    frame = compare_frame(report.runs, report.evals, baseline, report.targets)
    if frame.empty:
        algorithms = sorted(report.runs["algorithm"].unique())
        raise UserError(f"nothing to compare: no ok {baseline} run shares a workload/workers/"
                        f"slowdown with another algorithm (algorithms here: "
                        f"{', '.join(algorithms)}); pick one with --baseline")
    for note in report.notes():
        click.echo(f"- {note}")
    click.echo(compare_markdown(frame, baseline))
    click.echo(
        f"\nRatio of means over seeds, [{CONFIDENCE:.0%} range from the two t-intervals]. "
        f"Throughput > 1 and time to target < 1 are better than {baseline}. '*' marks a "
        "difference the seeds support (both sides >= 2 seeds, intervals apart); the others "
        "say why not.")


@click.command("reproduce")
@click.argument("name", type=click.Choice(["prague", "hop"]))
@click.option("--quick", is_flag=True, help="The scaled-down matrix (under 10 minutes).")
@click.option("--out", type=click.Path(path_type=Path),
              help="Results directory (default results/reproduce-NAME[-quick]).")
@click.option("--force", is_flag=True, help="Rerun runs that already finished.")
@click.option("--emulate", is_flag=True, help="On the paper's cluster as a network preset "
              "models it, with time dilation (its matrix: reproduce-NAME-emulated[-quick].toml "
              "in hetbench/reports/matrices/; docs/network.md).")
@click.option("--convergence", is_flag=True, help="Time to a target with real compute on real "
              "images (its matrix: reproduce-NAME-convergence[-quick].toml in "
              "hetbench/reports/matrices/; docs/convergence.md).")
@click.option("--dry-run", is_flag=True, help="List the runs and the published figures they "
              "cover; run nothing.")
@wait_flag
def reproduce_cmd(name: str, quick: bool, out: Path | None, force: bool, emulate: bool,
                  convergence: bool, dry_run: bool, wait: bool) -> None:
    """Run a paper's matrix and report our ratios beside the published ones."""
    import contextlib

    from hetbench.reports.reproduce import reproduce

    # Without --out, reproduce() picks the directory from the matrix; run_matrix then takes
    # its lock (without --wait).
    holding = (lock_results(out, f"bench reproduce {name}", wait)
               if out is not None and not dry_run else contextlib.nullcontext())
    with holding:
        paths, failed = reproduce(name, quick, out, force, echo=click.echo, emulate=emulate,
                                  dry_run=dry_run, convergence=convergence)
    if dry_run:
        return
    for kind in ("md", "html", "csv", "published_csv"):
        click.echo(f"{kind}: {paths[kind]}")
    if failed:
        click.echo(f"{failed} run(s) failed (see report.md, 'Runs not ok')", err=True)
        sys.exit(1)


@click.group("export")
def export_cmd() -> None:
    """Stored runs in other tools' formats (TensorBoard, Chrome/Perfetto traces)."""


RUN_HELP = "Run id (or unique prefix) to export; repeatable. Default: every run."


@export_cmd.command("tensorboard")
@click.argument("results_dir", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path),
              help="Log directory (default RESULTS_DIR/tensorboard): a subdirectory per run.")
@click.option("--run", "runs", multiple=True, help=RUN_HELP)
def export_tensorboard_cmd(results_dir: Path, out: Path | None, runs: tuple[str, ...]) -> None:
    """TensorBoard event files: test and training loss, throughput, time shares, hparams."""
    from hetbench.core.record import runs_read_once
    from hetbench.reports.load import select_run_dirs
    from hetbench.reports.tensorboard import export_tensorboard

    with runs_read_once():  # the scan's read of every event log serves the export too
        chosen = select_run_dirs(results_dir, runs, _scan(results_dir, events=True))
        out = make_results_dir(out if out is not None else results_dir / "tensorboard")
        for path in export_tensorboard(chosen, out):
            click.echo(f"tensorboard: {path}")
    click.echo(f"view with: tensorboard --logdir {out}")


@export_cmd.command("trace")
@click.argument("results_dir", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path),
              help="Directory for <run id>.json (default RESULTS_DIR/traces).")
@click.option("--run", "runs", multiple=True, help=RUN_HELP)
def export_trace_cmd(results_dir: Path, out: Path | None, runs: tuple[str, ...]) -> None:
    """Chrome trace event JSON of whole runs, for ui.perfetto.dev or chrome://tracing."""
    from hetbench.core.record import runs_read_once
    from hetbench.reports.load import select_run_dirs
    from hetbench.reports.trace import write_trace

    with runs_read_once():  # the scan's read of every event log serves the export too
        chosen = select_run_dirs(results_dir, runs, _scan(results_dir, events=True))
        out = make_results_dir(out if out is not None else results_dir / "traces")
        for run_dir in chosen:
            click.echo(f"trace: {write_trace(run_dir, out / f'{run_dir.name}.json')}")


COMMANDS: list[click.Command] = [report_cmd, compare_cmd, reproduce_cmd, export_cmd]
