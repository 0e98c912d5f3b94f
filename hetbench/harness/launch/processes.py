"""Stopping a job that a tool (torchrun, mpirun, a host's node) started, and everything under
it, whatever state it is in."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

#: How long torchrun / mpirun get to stop their ranks on SIGTERM before everything is killed.
STOP_GRACE_S = 10.0


def stop_job(proc: subprocess.Popen) -> None:
    """Stop torchrun / mpirun and every rank it started, whatever state they are in.

    torchrun puts each rank in a session of its own, so killing the tool's process group is not
    enough: the ranks are found as the tool's descendants before it is asked to stop.
    """
    if proc.poll() is not None:
        return  # both tools wait for their ranks before they exit
    tree = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # the tools stop their ranks on SIGTERM
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE_S)
    _kill([proc.pid, *tree, *_descendants(proc.pid)])
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (in parentheses) may hold spaces; the ppid follows the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
