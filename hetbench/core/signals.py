"""Termination signals handled like Ctrl-C, and ranks that die with their launcher.

A batch scheduler's cancel, `docker stop`, systemd and `timeout` send SIGTERM; a closed terminal
sends SIGHUP. `bench` turns both into `Stopped`, a KeyboardInterrupt, so they take Ctrl-C's path:
the running run is marked interrupted (with the signal's name), its processes are killed, the
finished runs are kept, and bench exits with 128 + the signal's number.

A launcher killed outright (SIGKILL, the OOM killer) cleans up nothing, so its children see to it
themselves. A service bench starts calls `die_with_parent()`: Linux signals it when its parent
dies (PR_SET_PDEATHSIG). Ranks cannot rely on that: their parent is the forkserver, and the
forkserver only exits once every process it forked has closed its end of the forkserver's
liveness pipe (each child inherits one), i.e. never while the ranks live. So a rank calls
`exit_with(launcher_pid)`: a thread that waits on the launcher's pidfd and kills the rank when
the launcher is gone. Under torchrun and mpirun, which bench starts in a session of their own,
bench's pid reaches the ranks through $HETBENCH_LAUNCHER_PID; once the ranks are gone the tool
ends the job itself (torchrun's agent with --max-restarts 0, mpirun on any rank's death).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time

#: The environment variable through which `bench run` gives ranks that torchrun or mpirun start
#: its pid, so that they exit with it (exit_with); absent when no bench watches the run.
LAUNCHER_PID_ENV = "HETBENCH_LAUNCHER_PID"
#: Signals that stop bench like Ctrl-C.
TERMINATING = (signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1


class Stopped(KeyboardInterrupt):
    """bench received a terminating signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_on_signals() -> None:
    """From now on SIGTERM and SIGHUP raise Stopped in the main thread (once: a second signal
    while the run is being cleaned up is ignored, so the clean-up finishes)."""
    def handler(signum, frame):
        for s in TERMINATING:
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    for s in TERMINATING:
        signal.signal(s, handler)


def interrupted_cause(exc: BaseException) -> str:
    """summary.json's cause for a run stopped by Ctrl-C or a signal."""
    if isinstance(exc, Stopped):
        return f"interrupted by {signal.Signals(exc.signum).name}"
    return "interrupted by the user (Ctrl-C)"


def exit_code(exc: BaseException | None) -> int:
    """128 + the signal's number, as shells report a process a signal ended (SIGINT: 130)."""
    while exc is not None and not isinstance(exc, KeyboardInterrupt):
        exc = exc.__cause__ or exc.__context__
    return 128 + (exc.signum if isinstance(exc, Stopped) else signal.SIGINT)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have Linux send `sig` to this process when its parent dies (elsewhere: nothing)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)


def exit_with(pid: int) -> None:
    """SIGKILL this process as soon as process `pid` (its launcher) ends: a daemon thread blocked
    on the launcher's pidfd (Linux 5.3+; elsewhere it checks once a second)."""
    def watch():
        try:
            fd = os.pidfd_open(pid)
            select.select([fd], [], [])
        except ProcessLookupError:
            pass  # already gone
        except (AttributeError, OSError):
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
