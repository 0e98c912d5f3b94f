"""One writer per results directory: an OS file lock on <out>/.hetbench.lock.

`bench run`, `bench sim`, `bench tune` and `bench reproduce` hold it for their lifetime
(results_lock). It is a flock(2) lock, so it dies with the process that holds it: a writer killed
outright (SIGKILL, the OOM killer) leaves no stale lock behind, at most the file, whose text then
names a process that no longer holds it (a writer that ends normally removes it). After taking
the lock the writer writes who it is (command, pid, host, start time) into the file, so a
second writer can name it.

Readers (`bench report`) never take the lock; writer_of() probes it without blocking to tell a
run in progress (its writer holds the lock) from one whose launcher is gone.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hetbench.errors import UserError

LOCK_FILE = ".hetbench.lock"

#: How long a writer retries a refused lock before naming its holder: a reader's probe
#: (writer_of) holds the lock for an instant, and must not make a writer give up.
PROBE_GRACE_S = 1.0

#: Results directories this process holds, by resolved path -> (open lock file, depth). A flock
#: belongs to an open file, so a second open of the same file in this process would be refused
#: by the first; nested holders (the CLI, then run_matrix) share one.
_held: dict[Path, list] = {}


class ResultsDirBusy(UserError):
    """Another process writes to this results directory."""


def lock_path(out_dir: Path) -> Path:
    return Path(out_dir) / LOCK_FILE


def make_results_dir(out_dir: Path) -> Path:
    """Create `out_dir` (and its parents); UserError in one line if it cannot be."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"results directory {out_dir} cannot be created "
                        f"({exc.strerror or exc}); pass --out to a writable directory") from exc
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UserError(f"results directory {out_dir} is not writable; pass --out to a "
                        "writable directory")
    return out_dir


def holds_lock(out_dir: Path) -> bool:
    """Does this process hold the lock of `out_dir`?"""
    return _key(out_dir) in _held


@contextlib.contextmanager
def results_lock(out_dir: Path, command: str, wait: bool = False,
                 on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold `out_dir`'s writer lock while the block runs (creating the directory).

    Another holder: ResultsDirBusy naming it (command, pid, start time), or with `wait`, wait
    for it (on_wait(who) is told once). Re-entrant within one process.
    """
    out_dir = make_results_dir(out_dir)
    key = _key(out_dir)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    path = lock_path(out_dir)
    fd = _lock_file(path, out_dir, wait, on_wait)
    try:
        _write_holder(fd, command)
        _held[key] = [fd, 1]
        try:
            yield
        finally:
            del _held[key]
            # Removed while still held, so the directory holds only results once its writer
            # is done; a writer killed outright leaves the file, which is harmless (the lock
            # is the flock, which died with it).
            with contextlib.suppress(OSError):
                os.unlink(path)
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def _lock_file(path: Path, out_dir: Path, wait: bool,
               on_wait: Callable[[str], None] | None) -> int:
    """An open descriptor of `path`, flock'ed exclusively: the file that `path` names now.

    A holder unlinks the file as it lets go, so a lock won on a file no longer at `path` guards
    nothing (a third writer may already hold a new file there): try again on the new one.
    """
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise UserError(f"results directory {out_dir}: cannot open its lock file {path} "
                            f"({exc.strerror or exc}); pass --out to a writable directory"
                            ) from exc
        try:
            _acquire(fd, out_dir, wait, on_wait)
            current = os.stat(path)
        except FileNotFoundError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        if current.st_ino == os.fstat(fd).st_ino and current.st_dev == os.fstat(fd).st_dev:
            return fd
        os.close(fd)


def writer_of(out_dir: Path) -> dict[str, Any] | None:
    """Who holds `out_dir`'s writer lock right now (what it wrote into the lock file; {} if it
    has not yet), or None when no process does. This process's own lock counts."""
    if holds_lock(out_dir):
        return _holder(lock_path(out_dir)) or {}
    path = lock_path(out_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # no lock file: no writer has ever run here
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(path) or {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def describe_holder(holder: dict[str, Any] | None) -> str:
    """`bench run` (pid 123 on host, since 2025-01-01 12:00:00), for one line."""
    if not holder:
        return "another process (it has not yet written who it is)"
    where = f" on {holder['host']}" if holder.get("host") else ""
    return (f"`{holder.get('command', 'bench')}` (pid {holder.get('pid', '?')}{where}, "
            f"since {holder.get('started_at', '?')})")


def _acquire(fd: int, out_dir: Path, wait: bool, on_wait: Callable[[str], None] | None) -> None:
    deadline = time.monotonic() + PROBE_GRACE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError as exc:  # a filesystem without locks (some network mounts)
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise UserError(f"results directory {out_dir} is on a filesystem without file "
                                f"locks ({exc.strerror}); pass --out to a local directory"
                                ) from exc
            raise
        if time.monotonic() < deadline:
            time.sleep(0.05)
            continue
        who = describe_holder(_holder(lock_path(out_dir)))
        if not wait:
            raise ResultsDirBusy(
                f"results directory {out_dir} is in use by {who}; wait for it to finish "
                "(or pass --wait), or pass another --out")
        if on_wait:
            on_wait(f"waiting for {who} to finish with {out_dir}")
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks; Ctrl-C / SIGTERM interrupt it
        return


def _write_holder(fd: int, command: str) -> None:
    record = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
              "started_at": datetime.datetime.now().isoformat(timespec="seconds")}
    data = (json.dumps(record) + "\n").encode()
    # Best effort: a full disk must not stop the lock from working (the lock is the flock, not
    # this text); the holder is then described as unknown.
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)


def _holder(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _key(out_dir: Path) -> Path:
    return Path(os.path.realpath(out_dir))
