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

import contextlib
import errno
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


class ResultsWriteError(OSError):
    """A result file could not be written (a full disk, a quota, a read-only or vanished
    directory): the run fails with this as its cause, and the matrix stops (the next run would
    fail the same way). Its message names the file and the OS error in one line."""

    def __init__(self, path: Path, error: OSError):
        super().__init__(error.errno, f"cannot write {path}: {error.strerror or error}")
        self.path = path

    def __str__(self) -> str:
        return self.strerror or super().__str__()

    @classmethod
    def because(cls, message: str, path: Path, errno_: int = errno.ENOSPC) -> ResultsWriteError:
        """One whose whole message is `message` (a run's failure, said in full)."""
        error = cls(path, OSError(errno_, ""))
        error.strerror = message
        return error


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: Read once, at import (reading it means setting it for a moment, which threads could see).
_UMASK = _read_umask()


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file beside `path`, then rename it over `path`; ResultsWriteError
    (and `path` untouched, no temp file left) when it cannot be written."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        # mkstemp makes the file private (0600); results are read by others (a team's share,
        # a web server), so give it what a plain open() would: 0666 less the umask.
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, ResultsWriteError):
            raise ResultsWriteError(path, exc) from exc
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


#: One encoder for every line (json.dumps with options builds a new one per call).
_LINE_ENCODER = json.JSONEncoder(separators=(",", ":"), default=float)


def jsonl_line(record: dict[str, Any], encoded_tail: str = "") -> str:
    """`record` as one line of a JSONL log: compact JSON, newline-terminated, with
    `encoded_tail` (',"k":v,...', already JSON: fields a writer encodes once) inside the
    object, after the record's own keys. The one format of every event line, real or
    simulated."""
    text = _LINE_ENCODER.encode(record)
    return (text[:-1] + encoded_tail + "}\n") if encoded_tail else text + "\n"


class EventLog:
    """Append-only JSON lines, written whole: a line, or a batch of whole lines, by one
    write(2) of the encoded bytes.

    The file never ends in part of a line: when the disk fills mid-write (a short write, then
    ENOSPC), the file is cut back to its last whole line and ResultsWriteError is raised (the
    rank's error path reports it as the run's cause).
    """

    def __init__(self, path: Path):
        self.path = path
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                               0o644)
            #: Bytes of whole lines in the file: where a failed append cuts it back to.
            self._whole = os.fstat(self._fd).st_size
        except OSError as exc:
            raise ResultsWriteError(path, exc) from exc

    def append(self, record: dict[str, Any], encoded_tail: str = "") -> None:
        self._write(jsonl_line(record, encoded_tail).encode())

    def append_many(self, records: list[dict[str, Any]]) -> None:
        """Several records in one write (the worker loop's batches, step_lines.py)."""
        if records:
            self._write("".join(jsonl_line(record) for record in records).encode())

    def _write(self, data: bytes) -> None:
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # a short write: the disk filled mid-line
                more = os.write(self._fd, data[written:])
                if more == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += more
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._whole)
            raise ResultsWriteError(self.path, exc) from exc
        self._whole += len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def cut_to_whole_lines(path: Path) -> int:
    """Cut a JSONL file back to its last newline (a writer that died mid-line, or one that
    wrote without EventLog); returns the bytes removed."""
    try:
        with path.open("rb+") as f:
            data = f.read()
            keep = data.rfind(b"\n") + 1
            if keep < len(data):
                f.truncate(keep)
            return len(data) - keep
    except OSError:
        return 0


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
