"""CLI commands that read stored results: `bench report` (and compare / reproduce as built).

Each is a click command appended to COMMANDS; hetbench.cli adds them to the `bench` group.
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command("report")
@click.argument("results_dir", type=click.Path(path_type=Path))
@click.option("--baseline", default="allreduce", show_default=True,
              help="Algorithm that throughput is normalised to.")
def report_cmd(results_dir: Path, baseline: str) -> None:
    """Write report.md and report.csv for the runs under RESULTS_DIR."""
    from hetbench.reports.report import write_report

    paths = write_report(results_dir, baseline)
    for kind, path in paths.items():
        click.echo(f"{kind}: {path}")


COMMANDS: list[click.Command] = [report_cmd]
