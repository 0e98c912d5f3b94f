"""Compute tables: per-worker, per-iteration compute seconds, the input of `replay:`.

A table is CSV with the header `worker,iteration,compute_s` (one row per worker and iteration,
workers 0..W-1 and iterations 0..K-1 all present, each pair once), or parquet with those columns.
`bench trace import` writes them from other formats (hetbench/cli/trace.py).

Named tables ship with hetbench in slowdown/traces/ (converted from published traces, with
their license and citation beside them); `replay:NAME` finds one there when NAME is not a file.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetbench.errors import UserError

COLUMNS = ("worker", "iteration", "compute_s")
#: Where the shipped tables are: slowdown/traces/<name>.csv.
SHIPPED_DIR = Path(__file__).with_name("traces")


@dataclass(frozen=True)
class ComputeTable:
    """compute_s[w, k]: worker w's compute seconds at iteration k (a full W x K grid)."""

    source: str
    compute_s: np.ndarray

    @property
    def workers(self) -> int:
        return self.compute_s.shape[0]

    @property
    def iterations(self) -> int:
        return self.compute_s.shape[1]

    def factors(self) -> np.ndarray:
        """max(1, c[w, k] / median over workers of c[., k]): how much slower than its
        iteration's median each worker is (workers at or below the median: 1)."""
        median = np.median(self.compute_s, axis=0, keepdims=True)
        return np.maximum(1.0, self.compute_s / median)


def shipped_tables() -> list[str]:
    """Names of the tables that ship with hetbench (replay:NAME)."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.csv"))


def resolve_table_path(text: str) -> Path:
    """The file a replay spec names: a path, or else the name of a shipped table."""
    path = Path(text).expanduser()
    if path.exists() or "/" in text or path.suffix:
        return path
    shipped = SHIPPED_DIR / f"{text}.csv"
    return shipped if shipped.is_file() else path


def read_table(path: Path) -> ComputeTable:
    """The table in `path` (.parquet by its suffix, else CSV); UserError naming the file and
    the line (CSV) or row (parquet) of the first problem."""
    if not path.exists():
        names = ", ".join(shipped_tables()) or "none"
        raise UserError(f"compute table {path} does not exist (shipped tables: {names})")
    if not path.is_file():
        raise UserError(f"compute table {path} is not a file")
    return _grid(path, _parquet_rows(path) if path.suffix == ".parquet" else _csv_rows(path))


def _csv_rows(path: Path) -> list[tuple[str, int, float, float]]:
    """(where, worker, iteration, compute_s) of every data row; `where` is "file:line"."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"compute table {path}: cannot read it ({exc})") from None
    header = None
    rows = []
    for line_no, row in enumerate(csv.reader(text.splitlines()), 1):
        if not row or row[0].lstrip().startswith("#"):
            continue
        if header is None:
            header = [h.strip() for h in row]
            if header != list(COLUMNS):
                raise UserError(f"compute table {path}:{line_no}: the header must be "
                                f"{','.join(COLUMNS)}, got {','.join(row)!r}")
            continue
        where = f"{path}:{line_no}"
        try:
            worker, iteration, compute = row
            rows.append((where, int(worker), int(iteration), float(compute)))
        except ValueError:
            raise UserError(f"compute table {where}: expected worker,iteration,compute_s "
                            f"(int,int,float), got {','.join(row)!r}") from None
    if header is None:
        raise UserError(f"compute table {path}: empty; the header must be {','.join(COLUMNS)}")
    return rows


def _parquet_rows(path: Path) -> list[tuple[str, int, float, float]]:
    frame = read_parquet(path, f"compute table {path}")
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"compute table {path}: missing column(s) {', '.join(missing)} "
                        f"(it has {', '.join(map(str, frame.columns))})")
    rows = []
    for i, (worker, iteration, compute) in enumerate(
            zip(*(frame[c].tolist() for c in COLUMNS), strict=True)):
        where = f"{path} row {i}"
        if not (float(worker).is_integer() and float(iteration).is_integer()):
            raise UserError(f"compute table {where}: worker and iteration must be integers, "
                            f"got {worker!r}, {iteration!r}")
        rows.append((where, int(worker), int(iteration), float(compute)))
    return rows


def read_parquet(path: Path, what: str):
    """A parquet file as a DataFrame (pyarrow reads it); UserError when it cannot be read."""
    import pandas as pd

    try:
        return pd.read_parquet(path)
    except ImportError:
        raise UserError(f"{what}: reading parquet needs pyarrow (pip install pyarrow)") from None
    except Exception as exc:  # pyarrow raises its own types for a damaged file
        raise UserError(f"{what}: cannot read it as parquet ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def _grid(path: Path, rows: list[tuple[str, int, float, float]]) -> ComputeTable:
    if not rows:
        raise UserError(f"compute table {path}: no rows")
    seen: dict[tuple[int, int], str] = {}
    for where, worker, iteration, compute in rows:
        if worker < 0 or iteration < 0:
            raise UserError(f"compute table {where}: worker and iteration must be >= 0")
        if not (math.isfinite(compute) and compute > 0):
            raise UserError(f"compute table {where}: compute_s must be a positive number, "
                            f"got {compute!r}")
        first = seen.setdefault((worker, iteration), where)
        if first != where:
            raise UserError(f"compute table {where}: duplicate row for worker {worker} iteration "
                            f"{iteration} (first at {first})")
    workers = 1 + max(w for w, _ in seen)
    iterations = 1 + max(k for _, k in seen)
    if len(seen) != workers * iterations:
        missing = next((w, k) for w in range(workers) for k in range(iterations)
                       if (w, k) not in seen)
        raise UserError(f"compute table {path}: {workers * iterations - len(seen)} of "
                        f"{workers} workers x {iterations} iterations missing, e.g. worker "
                        f"{missing[0]} iteration {missing[1]}; a table is a full grid")
    compute_s = np.empty((workers, iterations))
    for _, worker, iteration, compute in rows:
        compute_s[worker, iteration] = compute
    return ComputeTable(str(path), compute_s)


def table_csv(compute_s: np.ndarray, comment: str = "") -> str:
    """The CSV text of a W x K grid (comment lines first, each prefixed with '# ')."""
    lines = [f"# {line}" for line in comment.splitlines()] if comment else []
    lines.append(",".join(COLUMNS))
    lines += [f"{w},{k},{compute_s[w, k]:.6g}"
              for w in range(compute_s.shape[0]) for k in range(compute_s.shape[1])]
    return "\n".join(lines) + "\n"
