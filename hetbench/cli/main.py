"""`bench`: the command line. Its commands (`bench --help` lists them with a line each): list,
run, tune, report, compare, sim, reproduce, summarize, export, trace, testbed.

Bad input prints one line (`error: ...`) and exits with code 2; `--debug` shows the traceback.
"""

from __future__ import annotations

import os
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
from hetbench.cli.running import run_with_progress, variant_names_of
from hetbench.core.rundir import RunDir
from hetbench.core.signals import exit_code, stop_on_signals
from hetbench.errors import UserError

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hetbench", prog_name="bench",
                      message="%(prog)s (hetbench) %(version)s")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """hetbench: how does a synchronization algorithm hold up when some workers are slow?"""
    ctx.obj = {"debug": debug}
    from hetbench.core.plugins import PLUGINS_ENV

    if os.environ.get(PLUGINS_ENV):  # every command sees the plugins its ranks will load
        from hetbench.core.plugins import use

        use(())


@cli.command("list")
@click.option("--options/--no-options", default=True, help="Show each component's options.")
@plugin_flag
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
@click.option("--launcher", help="Who starts the ranks: local (default), torchrun, mpi or "
              "slurm (see docs/multi-node.md).")
@click.option("--force", is_flag=True, help="Rerun runs that already finished.")
@click.option("--dry-run", is_flag=True, help="List the runs the matrix expands to, run nothing.")
@click.option("--prepare", is_flag=True, help="Multi-node: only write each run's directory and "
              "print the torchrun/mpirun command to start on every machine.")
@click.option("--hosts", help="Run the ranks on these hosts (torchrun or mpi): HOST:SLOTS,... or "
              "a hostfile; results must be on a filesystem every host shares "
              "(docs/multi-node.md).")
@click.option("--rsh-agent", help="How to start a command on another host, called as AGENT "
              "HOST COMMAND (default: ssh -o BatchMode=yes; the test bed's: bench testbed rsh).")
@wait_flag
@oversubscribe_flag
@plugin_flag
def run_cmd(matrix_file, algorithms, workloads, workers, slowdown, iterations, seconds, seeds,
            pace_ms, target, out, launcher, force, dry_run, prepare, hosts, rsh_agent, network,
            dilation, wait, allow_oversubscribe) -> None:
    """Run a matrix of algorithms x workloads x workers x slowdowns x seeds."""
    from hetbench.core.launchers import DEFAULT_LAUNCHER, launcher_kind

    kind = launcher_kind(launcher or DEFAULT_LAUNCHER)
    if not (dry_run or prepare) and kind.warm_up:
        kind.load(kind.warm_up)()
    from hetbench.harness.matrix import check_writable, from_file_and_flags

    spec, configs = from_file_and_flags(
        matrix_file, algorithms=algorithms, workloads=workloads, workers=workers,
        slowdown=slowdown, iterations=iterations, seconds=seconds, seeds=seeds, pace_ms=pace_ms,
        launcher=launcher, network=network, dilation=dilation, target=target, hosts=hosts)
    from hetbench.harness.runner import check_runnable

    # Here, not only in run_matrix: a dry run starts nothing and is refused all the same.
    # Prepared runs start on other machines: this one's capacity is not theirs.
    check_runnable(configs, allow_oversubscribe, fit=not prepare)
    out_dir = out or Path("results") / str(spec["name"])
    check_writable(out_dir)
    for warning in _dilation_warnings(configs):
        click.echo(f"warning: {warning}", err=True)
    if dry_run:
        names = variant_names_of(configs)
        for config in configs:
            click.echo(f"{config.run_id}  {config.label(names[config.run_id])}")
        return
    from hetbench.core.store import write_json_atomic

    with lock_results(out_dir, "bench run" + (" --prepare" if prepare else ""), wait):
        # The matrix as run (file + flags), so `bench report` finds its `target` later.
        write_json_atomic(out_dir / "matrix.json", spec)
        if prepare:
            _prepare(configs, out_dir, force)
            return
        if "tune" in spec:
            click.echo("note: this matrix has a [tune] table; bench run runs its options as "
                       "given, `bench tune` runs the tuning trials", err=True)
        from hetbench.harness.launch import launcher_options

        failures = run_with_progress(configs, out_dir, force,
                                     launcher_options(spec, rsh_agent),
                                     allow_oversubscribe=allow_oversubscribe, checked=True)
    local = [c for c in configs
             if launcher_kind(c.launcher).on_this_machine and not c.hosts and not c.network]
    if local:  # the numbers are this host's: say so where the run ends, as the report does
        click.echo(f"note: {len(local)} run(s) measured this host, no network model: up to "
                   f"{max(c.world_size for c in local)} ranks shared its {os.cpu_count()} "
                   "cores and its loopback; for a cluster's costs use --network PRESET "
                   "(docs/network.md) or `bench sim`", err=True)
        if note := _shared_gpu_note(out_dir, local):
            click.echo(f"note: {note}", err=True)
    if failures:
        sys.exit(1)


def _shared_gpu_note(out_dir: Path, configs) -> str | None:
    """The report's shared-GPU note (reports/notes.py) for the runs just made, if their ranks
    shared a GPU."""
    if not any(c.device != "cpu" for c in configs):
        return None
    from hetbench.core.store import read_json
    from hetbench.reports.notes import gpu_row, shared_gpu_note

    runs = []
    for config in configs:
        try:
            summary = read_json(RunDir(out_dir / config.run_id).summary)
        except (OSError, ValueError):
            continue
        runs.append(gpu_row(summary, out_dir / config.run_id))
    return shared_gpu_note(runs)


def _dilation_warnings(configs) -> list[str]:
    """Emulated-network runs whose dilation is obviously too small for this host (once each)."""
    from hetbench.network.model import dilation_warning

    warnings = []
    for config in configs:
        if not config.network:
            continue
        options = config.workload_options
        compute_ms = options.get("compute_ms", 0.0) if config.compute == "emulated" else 0.0
        step_s = max(compute_ms, config.pace_ms) / 1000
        warning = dilation_warning(config.workers, os.cpu_count() or 1, step_s, config.dilation)
        if warning and warning not in warnings:
            warnings.append(warning)
    return warnings


def _prepare(configs, out_dir: Path, force: bool) -> None:
    """Prints `RUN_DIR WORLD_SIZE` per run to start (for scripts), the how-to on stderr."""
    import shlex

    from hetbench.core.launchers import launcher_kind
    from hetbench.core.plugins import PLUGINS_ENV
    from hetbench.harness.runner import prepare_matrix

    # Ranks started by hand load the plugins only if told to.
    plugins = (f"{PLUGINS_ENV}={shlex.quote(os.environ[PLUGINS_ENV])} "
               if os.environ.get(PLUGINS_ENV) else "")

    for config, run_dir, finished in prepare_matrix(configs, out_dir, force, checked=True):
        if finished:
            click.echo(f"skip {config.label()}: already finished", err=True)
            continue
        click.echo(f"{run_dir} {config.world_size}")
        hint = launcher_kind(config.launcher).prepare_hint.format(
            plugins=plugins, plugins_x=f"-x {PLUGINS_ENV} " if plugins else "",
            world=config.world_size, run_id=config.run_id, run_dir=run_dir)
        click.echo(f"  {config.label()}: {hint}", err=True)
    click.echo("then `bench summarize RUN_DIR` writes each run's summary.json "
               "(docs/multi-node.md)", err=True)


@cli.command("summarize")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@plugin_flag
def summarize_cmd(run_dirs) -> None:
    """Write summary.json of runs that torchrun/mpirun ran without `bench run` (multi-node)."""
    from hetbench.core.config import RunConfig
    from hetbench.core.identity import code_identity
    from hetbench.core.store import read_json
    from hetbench.harness.launch.base import with_code
    from hetbench.harness.launch.external import summarize_run_dir

    failed = 0
    for run_dir in run_dirs:
        # The code of this checkout: the ranks ran the same (a shared filesystem).
        summary = with_code(run_dir, summarize_run_dir(run_dir), code_identity(
            RunConfig.from_dict(read_json(RunDir(run_dir).config))))
        if summary["status"] == "ok":
            click.echo(f"ok   {run_dir}: {summary['throughput']:.1f} samples/s")
        else:
            failed += 1
            click.echo(f"FAIL {run_dir}: {summary['cause']}")
    if failed:
        sys.exit(1)


def _add_commands() -> None:
    """The commands of cli/report.py (report / compare / reproduce), cli/sim.py (sim),
    cli/tune.py (tune), cli/trace.py (trace) and cli/testbed.py (testbed), each module
    exporting a COMMANDS list."""
    from hetbench.cli.report import COMMANDS as report_commands
    from hetbench.cli.sim import COMMANDS as sim_commands
    from hetbench.cli.testbed import COMMANDS as testbed_commands
    from hetbench.cli.trace import COMMANDS as trace_commands
    from hetbench.cli.tune import COMMANDS as tune_commands

    for command in [*report_commands, *sim_commands, *tune_commands, *trace_commands,
                    *testbed_commands]:
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
    except OSError as exc:
        # Results that cannot be written (a full disk: ResultsWriteError says which run and
        # whether its failure is on record), or a file that cannot be read: one line, exit 1.
        if debug:
            raise
        from hetbench.core.store import ResultsWriteError

        text = str(exc) if isinstance(exc, ResultsWriteError) else (
            f"{exc} (--debug shows where)")
        click.echo(f"error: {text}", err=True)
        sys.exit(EXIT_FAILED)
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
