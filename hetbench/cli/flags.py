"""The matrix flags shared by `bench run`, `bench sim` and `bench tune`: all expand the same
matrix."""

from __future__ import annotations

from pathlib import Path

import click

_MATRIX_FLAGS = [
    click.argument("matrix_file", required=False, type=click.Path(path_type=Path)),
    click.option("--algorithms", help="Comma-separated algorithm names (see `bench list`)."),
    click.option("--workloads", help="Comma-separated workload names."),
    click.option("--workers", help="Comma-separated worker counts, e.g. 4,8."),
    click.option("--slowdown",
                 help="Comma-separated slowdown specs: none, prob:5, det:5@0,3 ..."),
    click.option("--iterations", type=int, help="Iterations per worker."),
    click.option("--seconds", type=float,
                 help="Wall-clock budget per run (seconds; simulated seconds in `bench sim`)."),
    click.option("--seeds", help="Comma-separated seeds, or a count N meaning seeds 1..N."),
    click.option("--pace-ms", type=float, help="Floor on each iteration's compute time (ms)."),
    click.option("--target", help="Convergence target the report times each run to, e.g. "
                 "accuracy:0.85 or loss:0.5 (as the matrix file's `target`)."),
    click.option("--network", help="The cluster's network model: a preset name (prague, hop, "
                 "ethernet-10g), in place of the matrix's [network] table; 'none' for none "
                 "(docs/network.md)."),
    click.option("--dilation", type=float, help="Time dilation of the network model (host "
                 "seconds per cluster second; the simulator plays cluster time and only "
                 "records it, so that its runs match an emulated matrix's)."),
]


def matrix_flags(command):
    """Adds the matrix file argument and the axis flags (passed to from_file_and_flags)."""
    for flag in reversed(_MATRIX_FLAGS):
        command = flag(command)
    return command


def wait_flag(command):
    """--wait: a writer that finds its results directory in use waits for it (core.lock)."""
    return click.option("--wait", is_flag=True,
                        help="If another bench writes to the results directory, wait for it to "
                             "finish instead of stopping.")(command)


def lock_results(out_dir: Path, command: str, wait: bool):
    """The writer lock of `out_dir` for a CLI command (one line on stderr while it waits)."""
    from hetbench.core.lock import results_lock

    return results_lock(out_dir, command, wait=wait,
                        on_wait=lambda what: click.echo(f"note: {what}", err=True))


def oversubscribe_flag(command):
    """--allow-oversubscribe: start a world that the capacity check says cannot fit here."""
    return click.option("--allow-oversubscribe", is_flag=True,
                        help="Start worlds larger than this machine's memory or "
                             "ranks-per-core bound allows (harness/launch/capacity.py).")(command)


def plugin_flag(command):
    """--plugin PATH_OR_MODULE (repeatable): load a plugin for this command, without installing
    it (core/plugins.py says how each spec is read); it also sets HETBENCH_PLUGINS, so that
    every rank the command starts loads it too."""
    return click.option(
        "--plugin", "plugins", multiple=True, expose_value=False, is_eager=True,
        metavar="PATH_OR_MODULE", callback=_use_plugins,
        help="Load an algorithm or workload plugin for this command: a .py file, a package "
             "directory, a `pip install --target` directory or a module name; repeatable (as "
             "HETBENCH_PLUGINS, os.pathsep-separated).")(command)


def _use_plugins(ctx: click.Context, param: click.Parameter, specs: tuple[str, ...]) -> None:
    if specs:
        from hetbench.core.plugins import use

        use(specs)
