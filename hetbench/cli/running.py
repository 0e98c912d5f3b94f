"""Running a list of RunConfigs with a progress bar: shared by `bench run` and `bench tune`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hetbench.core.signals import exit_code, interrupted_cause


def variant_names_of(configs) -> dict[str, str]:
    """run_id -> the name that tells it apart from runs of its algorithm with other options."""
    from hetbench.core.variants import variant_names, with_network

    names = variant_names((c.algorithm, c.workload, c.algorithm_options,
                           with_network(c.workload_options, c.network, c.timing)) for c in configs)
    return {c.run_id: name for c, name in zip(configs, names, strict=True)}


def run_with_progress(configs, out_dir: Path, force: bool,
                       launcher_options: dict | None = None,
                       allow_oversubscribe: bool = False, checked: bool = False) -> int:
    """Runs the matrix with a progress bar; returns how many runs failed. `checked`: the
    caller has refused what cannot run (harness.runner.check_runnable)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hetbench.harness.runner import run_matrix

    console = Console(stderr=False)
    failures = 0
    names = variant_names_of(configs)
    console.print(escape(f"{len(configs)} run(s) -> {out_dir}"))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        matrix_task = progress.add_task("matrix", total=len(configs))
        run_task = progress.add_task("run", total=None, visible=False)
        started = {}

        def on_start(config):
            started["t"] = time.time()
            progress.update(run_task, description=config.label(names[config.run_id]),
                            completed=0,
                            total=None, visible=True)

        def on_progress(done, expected):
            progress.update(run_task, completed=done, total=expected or None)

        def on_set_aside(config, what):
            console.print(f"[yellow]rerun[/yellow] {escape(config.label(names[config.run_id]))}: "
                          f"{escape(what)}")

        def on_done(outcome):
            nonlocal failures
            s = outcome.summary
            progress.advance(matrix_task)
            progress.update(run_task, visible=False)
            # Causes quote library messages ("[/path/pair.cc:545] ..."): not rich markup.
            label = escape(outcome.config.label(names[outcome.config.run_id]))
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
                       on_progress=on_progress, on_set_aside=on_set_aside,
                       launcher_options=launcher_options,
                       allow_oversubscribe=allow_oversubscribe, checked=checked)
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM or SIGHUP
            console.print(f"[yellow]interrupted[/yellow] ({escape(interrupted_cause(exc))}): "
                          "finished runs are kept; the running one is marked interrupted. "
                          "Rerun the same command to resume.")
            sys.exit(exit_code(exc))
    console.print(escape(f"results in {out_dir}; `bench report {out_dir}` writes the report"))
    if failures:
        console.print(f"[red]{failures} of {len(configs)} run(s) failed[/red] (see summary.json)")
    return failures
