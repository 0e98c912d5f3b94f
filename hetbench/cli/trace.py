"""`bench trace import SRC --out TABLE`: a compute table for `replay:` from another format.

Formats:
- bytedance: a trace of the OSDI'25 straggler artifact (ByteDance-Seed/StragglerAnalysis,
  trace-<name>.parquet). A data-parallel rank's compute at a step is its slowest pipeline
  stage's summed forward-compute + backward-compute (the slowest rank of a stage when tensor
  or sequence parallelism gives it several); the traced steps, in order, become iterations
  0..K-1 and the data-parallel ranks workers 0..W-1.
- hetbench-run: a run directory of `bench run` or `bench sim`: each worker's measured
  compute_s (events.rank<r>.jsonl; the injected slowdown not included) at its i-th step, for
  the steps every worker finished.

The table is written atomically (.parquet by the suffix of --out, else CSV): a failed import
leaves nothing behind and changes no existing file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import click
import numpy as np

from hetbench.core.rundir import RunDir
from hetbench.core.store import read_jsonl, write_text_atomic
from hetbench.errors import UserError
from hetbench.slowdown.table import COLUMNS, read_parquet, table_csv

FORMATS = ("bytedance", "hetbench-run")
BYTEDANCE_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "duration")
COMPUTE_OPS = ("forward-compute", "backward-compute")


def bytedance_compute(path: Path) -> tuple[np.ndarray, list[int]]:
    """(compute_s[dp_rank, i], the trace's step number of each i) of an artifact trace."""
    frame = read_parquet(path, f"trace {path}")
    missing = [c for c in BYTEDANCE_COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"trace {path}: missing column(s) {', '.join(missing)} of the "
                        f"ByteDance format ({', '.join(BYTEDANCE_COLUMNS)})")
    ops = frame[frame["optype"].astype(str).isin(COMPUTE_OPS)]
    if ops.empty:
        raise UserError(f"trace {path}: no {' or '.join(COMPUTE_OPS)} rows")
    per_rank = ops.groupby(["dp_rank", "stage", "rank", "step"], observed=True)["duration"].sum()
    per_stage = per_rank.groupby(level=["dp_rank", "stage", "step"]).max()
    per_dp = per_stage.groupby(level=["dp_rank", "step"]).max().unstack("step")
    dp_ranks = per_dp.index.tolist()
    if dp_ranks != list(range(len(dp_ranks))):
        raise UserError(f"trace {path}: data-parallel ranks {dp_ranks} are not "
                        f"0..{len(dp_ranks) - 1}")
    incomplete = per_dp.columns[per_dp.isna().any(axis=0)].tolist()
    if incomplete:
        raise UserError(f"trace {path}: step(s) {incomplete[:5]} lack compute on some "
                        "data-parallel rank")
    return per_dp.to_numpy(dtype=np.float64), [int(s) for s in per_dp.columns]


def run_compute(run_dir: Path) -> np.ndarray:
    """compute_s[worker, i] of a hetbench run directory: each worker's i-th step, for the
    steps every worker finished."""
    config_path = RunDir(run_dir).config
    try:
        workers = int(json.loads(config_path.read_text())["workers"])
    except FileNotFoundError:
        raise UserError(f"{run_dir} is not a hetbench run directory (no config.json)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{config_path}: cannot read the run's workers ({exc})") from None
    columns = []
    for rank in range(workers):
        path = RunDir(run_dir).events(rank)
        try:
            events, _ = read_jsonl(path)
        except OSError as exc:
            raise UserError(f"{path}: cannot read it ({exc})") from None
        steps = sorted((e["iteration"], e["compute_s"]) for e in events
                       if isinstance(e.get("iteration"), int)
                       and isinstance(e.get("compute_s"), int | float))
        if not steps:
            raise UserError(f"{path}: no steps with compute_s (did the run start?)")
        columns.append([c for _, c in steps])
    steps = min(len(c) for c in columns)
    return np.array([c[:steps] for c in columns], dtype=np.float64)


def write_table(out: Path, compute_s: np.ndarray, comment: str) -> None:
    """The table at `out`, replaced whole or not at all."""
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give the table's file name")
    if not (np.isfinite(compute_s).all() and (compute_s > 0).all()):
        w, k = np.argwhere(~(np.isfinite(compute_s) & (compute_s > 0)))[0]
        raise UserError(f"worker {w} iteration {k}: compute {compute_s[w, k]!r} s is not "
                        "positive; a compute table needs every time > 0")
    if out.suffix != ".parquet":
        write_text_atomic(out, table_csv(compute_s, comment))
        return
    import pandas as pd

    workers, iterations = np.meshgrid(np.arange(compute_s.shape[0]),
                                      np.arange(compute_s.shape[1]), indexing="ij")
    frame = pd.DataFrame(dict(zip(COLUMNS, (workers.ravel(), iterations.ravel(),
                                            compute_s.ravel()), strict=True)))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, out)
    except ImportError:
        raise UserError("writing parquet needs pyarrow (pip install pyarrow); or write .csv")\
            from None
    finally:
        with contextlib.suppress(OSError):
            Path(tmp).unlink(missing_ok=True)


@click.group("trace")
def trace_cmd() -> None:
    """Compute tables for the replay:PATH slowdown."""


@trace_cmd.command("import")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="The table to write: .csv (worker,iteration,compute_s) or .parquet.")
@click.option("--format", "fmt", type=click.Choice(FORMATS),
              help="SRC's format (default: hetbench-run for a directory, else bytedance).")
def import_cmd(src: Path, out: Path, fmt: str | None) -> None:
    """Convert SRC (a ByteDance straggler-artifact parquet trace, or a hetbench run
    directory) into a compute table for `--slowdown replay:TABLE`."""
    if not src.exists():
        raise UserError(f"{src} does not exist")
    fmt = fmt or ("hetbench-run" if src.is_dir() else "bytedance")
    if fmt == "bytedance":
        if src.is_dir():
            raise UserError(f"{src} is a directory; --format bytedance reads a parquet trace")
        compute_s, steps = bytedance_compute(src)
        comment = (f"from {src.name} (ByteDance straggler artifact): per data-parallel rank, "
                   "the slowest pipeline stage's forward+backward compute per step\n"
                   f"iterations 0..{len(steps) - 1} are the trace's steps "
                   f"{' '.join(map(str, steps))}")
    else:
        if not src.is_dir():
            raise UserError(f"{src} is not a directory; --format hetbench-run reads a run "
                            "directory (results/<matrix>/<run_id>)")
        compute_s = run_compute(src)
        comment = f"from hetbench run {src.name}: each worker's measured compute_s per step"
    write_table(out, compute_s, comment)
    factors = np.maximum(1.0, compute_s / np.median(compute_s, axis=0, keepdims=True))
    click.echo(f"wrote {out}: {compute_s.shape[0]} workers x {compute_s.shape[1]} iterations; "
               f"replayed, the slowest worker is {factors.max(axis=0).mean():.3f}x its "
               "iteration's median on average")


COMMANDS: list[click.Command] = [trace_cmd]
