"""`bench`: list | run | report.

Bad input prints one line (`error: ...`) and exits with code 2; `--debug` shows the traceback.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from hetbench.cli.flags import matrix_flags
from hetbench.core.signals import exit_code, interrupted_cause, stop_on_signals
from hetbench.errors import UserError

EXIT_BAD_INPUT = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """hetbench: how does a synchronization algorithm hold up when some workers are slow?"""
    ctx.obj = {"debug": debug}


@cli.command("list")
@click.option("--options/--no-options", default=True, help="Show each component's options.")
def list_cmd(options: bool) -> None:
    """Every registered algorithm, workload and slowdown kind, with options and defaults."""
    from hetbench.core.options import describe_options
    from hetbench.core.registry import ALGORITHMS, WORKLOADS
    from hetbench.slowdown import slowdown_kinds

    for title, registry in (("algorithms", ALGORITHMS), ("workloads", WORKLOADS)):
        click.echo(f"{title}:")
        for name in registry.names():
            try:
                cls = registry.get(name)
            except UserError as exc:
                click.echo(f"  {name:<16} (unavailable: {exc})")
                continue
            click.echo(f"  {name:<16} {cls.description}")
            if options:
                for opt_name, default, doc in describe_options(cls.Config):
                    click.echo(f"      {opt_name} = {default!r}  {doc}")
    click.echo("slowdown kinds:")
    for syntax, description in slowdown_kinds():
        click.echo(f"  {syntax:<16} {description}")
    # Optional back-ends that are built separately, so a user sees what is missing before a run.
    optional = []
    for name in ALGORITHMS.names():
        try:
            features = ALGORITHMS.get(name).optional_features()
        except UserError:
            continue  # shown as unavailable above
        optional += [f"  {name} {feature}: {why or 'available'}"
                     for feature, why in features.items()]
    if optional:
        click.echo("optional:")
        for line in optional:
            click.echo(line)


@cli.command("run")
@matrix_flags
@click.option("--out", type=click.Path(path_type=Path), help="Results directory.")
@click.option("--launcher", help="Who starts the ranks: local (default), torchrun or mpi "
              "(see docs/multi-node.md).")
@click.option("--force", is_flag=True, help="Rerun runs that already finished.")
@click.option("--dry-run", is_flag=True, help="List the runs the matrix expands to, run nothing.")
@click.option("--prepare", is_flag=True, help="Multi-node: only write each run's directory and "
              "print the torchrun/mpirun command to start on every machine.")
def run_cmd(matrix_file, algorithms, workloads, workers, slowdown, iterations, seconds, seeds,
            pace_ms, out, launcher, force, dry_run, prepare) -> None:
    """Run a matrix of algorithms x workloads x workers x slowdowns x seeds."""
    from hetbench.harness.matrix import check_writable, from_file_and_flags

    spec, configs = from_file_and_flags(
        matrix_file, algorithms=algorithms, workloads=workloads, workers=workers,
        slowdown=slowdown, iterations=iterations, seconds=seconds, seeds=seeds, pace_ms=pace_ms,
        launcher=launcher)
    out_dir = out or Path("results") / str(spec["name"])
    check_writable(out_dir)
    if dry_run:
        for config in configs:
            click.echo(f"{config.run_id}  {config.label()}")
        return
    from hetbench.core.store import write_json_atomic

    # The matrix as run (file + flags), so `bench report` finds its `target` later.
    write_json_atomic(out_dir / "matrix.json", spec)
    if prepare:
        _prepare(configs, out_dir, force)
        return
    _run_with_progress(configs, out_dir, force)


def _prepare(configs, out_dir: Path, force: bool) -> None:
    """Prints `RUN_DIR WORLD_SIZE` per run to start (for scripts), the how-to on stderr."""
    from hetbench.harness.runner import prepare_matrix

    for config, run_dir, finished in prepare_matrix(configs, out_dir, force):
        if finished:
            click.echo(f"skip {config.label()}: already finished", err=True)
            continue
        click.echo(f"{run_dir} {config.world_size}")
        if config.launcher == "torchrun":
            hint = (f"on every machine: torchrun --nnodes N --nproc-per-node {config.world_size}/N "
                    f"--rdzv-backend c10d --rdzv-endpoint HOST0:29500 --rdzv-id {config.run_id}"
                    f" --max-restarts 0 -m hetbench.harness.worker --run-dir {run_dir}")
        else:
            hint = (f"on one machine: mpirun -n {config.world_size} --hostfile HOSTS "
                    f"python -m hetbench.harness.worker --run-dir {run_dir}")
        click.echo(f"  {config.label()}: {hint}", err=True)
    click.echo("then `bench summarize RUN_DIR` writes each run's summary.json "
               "(docs/multi-node.md)", err=True)


@cli.command("summarize")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
def summarize_cmd(run_dirs) -> None:
    """Write summary.json of runs that torchrun/mpirun ran without `bench run` (multi-node)."""
    from hetbench.harness.launch.external import summarize_run_dir

    failed = 0
    for run_dir in run_dirs:
        summary = summarize_run_dir(run_dir)
        if summary["status"] == "ok":
            click.echo(f"ok   {run_dir}: {summary['throughput']:.1f} samples/s")
        else:
            failed += 1
            click.echo(f"FAIL {run_dir}: {summary['cause']}")
    if failed:
        sys.exit(1)


def _run_with_progress(configs, out_dir: Path, force: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hetbench.harness.runner import run_matrix

    console = Console(stderr=False)
    failures = 0
    console.print(escape(f"{len(configs)} run(s) -> {out_dir}"))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        matrix_task = progress.add_task("matrix", total=len(configs))
        run_task = progress.add_task("run", total=None, visible=False)
        started = {}

        def on_start(config):
            started["t"] = time.time()
            progress.update(run_task, description=config.label(), completed=0,
                            total=None, visible=True)

        def on_progress(done, expected):
            progress.update(run_task, completed=done, total=expected or None)

        def on_set_aside(config, what):
            console.print(f"[yellow]rerun[/yellow] {escape(config.label())}: an earlier attempt "
                          f"did not finish ({escape(what)})")

        def on_done(outcome):
            nonlocal failures
            s = outcome.summary
            progress.advance(matrix_task)
            progress.update(run_task, visible=False)
            # Causes quote library messages ("[/path/pair.cc:545] ..."): not rich markup.
            label = escape(outcome.config.label())
            if outcome.skipped:
                console.print(f"[dim]skip[/dim] {label}: already finished")
            elif s["status"] == "ok":
                acc = s.get("final_test_accuracy")
                acc_text = f", test acc {acc:.3f}" if acc is not None else ""
                console.print(f"[green]ok[/green]   {label}: {s['throughput']:.1f} samples/s"
                              f"{acc_text} ({s['wall_s']:.1f} s)")
            else:
                failures += 1
                console.print(f"[red]FAIL[/red] {label}: {escape(str(s['cause']))}")

        try:
            run_matrix(configs, out_dir, force=force, on_start=on_start, on_done=on_done,
                       on_progress=on_progress, on_set_aside=on_set_aside)
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM or SIGHUP
            console.print(f"[yellow]interrupted[/yellow] ({escape(interrupted_cause(exc))}): "
                          "finished runs are kept; the running one is marked interrupted. "
                          "Rerun the same command to resume.")
            sys.exit(exit_code(exc))
    console.print(escape(f"results in {out_dir}; `bench report {out_dir}` writes the report"))
    if failures:
        console.print(f"[red]{failures} of {len(configs)} run(s) failed[/red] (see summary.json)")
        sys.exit(1)


def _add_commands() -> None:
    """The commands of cli/report.py (report / compare / reproduce) and cli/sim.py (sim), each
    module exporting a COMMANDS list."""
    from hetbench.cli.report import COMMANDS as report_commands
    from hetbench.cli.sim import COMMANDS as sim_commands

    for command in [*report_commands, *sim_commands]:
        cli.add_command(command)


_add_commands()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    stop_on_signals()
    try:
        cli.main(args=args, prog_name="bench", standalone_mode=False)
    except UserError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort as exc:  # click's form of Ctrl-C (and of SIGTERM / SIGHUP: Stopped)
        click.echo("aborted", err=True)
        sys.exit(exit_code(exc))
    except click.ClickException as exc:
        if debug:
            raise
        click.echo(f"error: {exc.format_message()} (see `bench {_command(args)} --help`)",
                   err=True)
        sys.exit(EXIT_BAD_INPUT)


def _command(args: list[str]) -> str:
    return next((a for a in args if not a.startswith("-")), "")


if __name__ == "__main__":
    main()
