"""The result store: append-only event logs and atomically replaced JSON files.

results/<matrix>/<run_id>/
    config.json          the resolved RunConfig
    env.json             versions, machine, git sha
    events.rank<r>.jsonl one line per iteration per worker
    eval.jsonl           test loss/accuracy of the delivered model over time
    summary.json         status ok|failed|interrupted, cause, throughput, ...
Nothing here is ever half-written: JSON files go to a temp file then os.replace; JSONL lines are
appended whole and flushed, and a reader skips a torn last line.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hetbench.core.config import SCHEMA_VERSION

#: A run's helper process (a service such as Prague's Group Generator) leaves the CPU seconds it
#: spent serving in run_dir / SERVICE_CPU_FILE.format(name=...) as {"cpu_s": ...}; the summary's
#: train_cpu_s adds them to the ranks' own.
SERVICE_CPU_FILE = "service-{name}.cpu.json"


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file beside `path`, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


class EventLog:
    """Append-only JSON lines; each record is written whole and flushed."""

    def __init__(self, path: Path):
        self.path = path
        self._file = path.open("a", buffering=1)

    def append(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":"), default=float) + "\n")

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Records of a JSONL file and the number of torn/garbled lines skipped: a line that is not
    a JSON object (cut short by a crash or a full disk, not UTF-8, or garbage) is counted, not
    fatal. A missing file has no records; one that cannot be read raises OSError."""
    records, torn = [], 0
    if not path.exists():
        return records, torn
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:  # JSONDecodeError, UnicodeDecodeError
                torn += 1
                continue
            if isinstance(record, dict):
                records.append(record)
            else:
                torn += 1
    return records, torn


def environment() -> dict[str, Any]:
    """Versions, machine and git state, written beside every run's measurements."""
    import torch

    env = {
        "schema_version": SCHEMA_VERSION,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gloo_available": torch.distributed.is_gloo_available(),
        "nccl_available": torch.distributed.is_nccl_available(),
    }
    env.update(_git_state())
    return env


def _git_state() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return {"git_sha": None, "git_dirty": None}
    return {"git_sha": sha or None, "git_dirty": bool(dirty) if sha else None}
