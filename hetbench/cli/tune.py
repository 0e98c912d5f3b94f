"""`bench tune`: equal hyperparameter trials per algorithm (hetbench.harness.tune)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hetbench.cli.flags import (
    lock_results,
    matrix_flags,
    oversubscribe_flag,
    plugin_flag,
    wait_flag,
)
from hetbench.errors import UserError


@click.command("tune")
@matrix_flags
@click.option("--trials", type=int, help="Trials per algorithm and cell (default: [tune] trials).")
@click.option("--out", type=click.Path(path_type=Path), help="Results directory.")
@click.option("--force", is_flag=True, help="Rerun trials that already finished.")
@click.option("--dry-run", is_flag=True, help="List the trials and their values, run nothing.")
@wait_flag
@oversubscribe_flag
@plugin_flag
def tune_cmd(matrix_file, algorithms, workloads, workers, slowdown, iterations, seconds, seeds,
             pace_ms, target, network, dilation, trials, out, force, dry_run, wait,
             allow_oversubscribe) -> None:
    """Tune every algorithm with the same number of trials from the matrix's [tune] search
    space, then score each by its best trial's time to target (AlgoPerf's external ruleset)."""
    from hetbench.cli.running import run_with_progress, variant_names_of
    from hetbench.core.store import write_json_atomic
    from hetbench.harness.matrix import check_writable, from_file_and_flags
    from hetbench.harness.tune import TUNE_FILE, expand_tuning, tune_record

    if matrix_file is None:
        raise UserError("bench tune needs a matrix file with a [tune] table (see docs/tuning.md)")
    spec, base = from_file_and_flags(
        matrix_file, algorithms=algorithms, workloads=workloads, workers=workers,
        slowdown=slowdown, iterations=iterations, seconds=seconds, seeds=seeds, pace_ms=pace_ms,
        network=network, dilation=dilation, target=target)
    ruleset, drawn = expand_tuning(spec, base, trials)
    configs = [config for config, _, _ in drawn]
    out_dir = out or Path("results") / f"{spec['name']}"
    check_writable(out_dir)
    click.echo(f"tuning: {ruleset.describe()}", err=True)
    from hetbench.harness.runner import check_runnable

    check_runnable(configs, allow_oversubscribe)
    if dry_run:
        names = variant_names_of(configs)
        for config, t, _ in drawn:
            click.echo(f"{config.run_id}  trial {t}: {config.label(names[config.run_id])}")
        return
    with lock_results(out_dir, "bench tune", wait):
        # Before any trial runs: a cut-off tuning session still reports the trials it finished.
        write_json_atomic(out_dir / "matrix.json", spec)
        write_json_atomic(out_dir / TUNE_FILE, tune_record(ruleset, drawn))
        from hetbench.harness.launch import launcher_options

        failures = run_with_progress(configs, out_dir, force, launcher_options(spec),
                                     allow_oversubscribe=allow_oversubscribe, checked=True)
    _print_best(out_dir)
    if failures:
        sys.exit(1)


def _print_best(out_dir: Path) -> None:
    from hetbench.core.store import read_json
    from hetbench.reports.report import build_report
    from hetbench.reports.tables import to_markdown
    from hetbench.reports.targets import targets_from_matrix

    targets = targets_from_matrix(read_json(out_dir / "matrix.json"))
    report = build_report(out_dir, targets=targets)
    if report.tuned is not None and not report.tuned.empty:
        click.echo(to_markdown(report.tuned))
    click.echo(f"`bench report {out_dir}` writes the whole report (tuned comparison first)")


COMMANDS = [tune_cmd]
