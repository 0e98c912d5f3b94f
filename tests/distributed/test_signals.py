"""Signals to `bench run`: SIGTERM and SIGHUP stop it as Ctrl-C does, and a launcher killed
outright (SIGKILL) leaves no rank or service running, under the local launcher and under
torchrun and mpirun (issue 22).

"Every process of the run" is found by a tag in the environment: bench is started with a unique
HETBENCH_TEST_TAG, which every process below it inherits (the forkserver and the resource
tracker, torchrun's agent, mpirun's daemon, the ranks, the Group Generator), whether or not it
logged its pid.
"""

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.distributed.test_faults import _training_run, alive, rank_pids
from tests.distributed.test_launchers import needs_mpi
from tests.helpers import rotation_day, skip_unless_today

#: Every process of the run must be gone this soon after bench is stopped.
GONE_S = 10
TAG_ENV = "HETBENCH_TEST_TAG"


def start_bench(tmp_path, bench_cmd, cli_env, algorithm, launcher="local", wait=True):
    """`bench run` of a long 4-worker run with its own tag; (proc, matrix, out, tag, run_dir)
    with run_dir once training started (None when wait is False)."""
    out = tmp_path / "out"
    matrix = tmp_path / "m.toml"
    matrix.write_text(f'algorithms = ["{algorithm}"]\nworkloads = ["mlp-digits"]\n'
                      f'workers = [4]\niterations = 100000\npace_ms = 5\n'
                      f'launcher = "{launcher}"\n')
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([*bench_cmd, "run", str(matrix), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**cli_env, TAG_ENV: tag})
    return proc, matrix, out, tag, (_training_run(out) if wait else None)


def tagged(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment holds the tag."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"{TAG_ENV}={tag}".encode() in environ.split(b"\0") and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def gone_within(tag: str, seconds: float) -> list[str]:
    """[] once no process of the run is alive; else the survivors' command lines."""
    deadline = time.time() + seconds
    while tagged(tag) and time.time() < deadline:
        time.sleep(0.2)
    return [_cmdline(pid) for pid in tagged(tag)]


def _cmdline(pid: int) -> str:
    try:
        return f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[
            :120].decode(errors="replace")
    except OSError:
        return f"{pid}: (gone)"


def _logged_pids(run_dir) -> list[int]:
    """Every rank's pid (from its log) and every service's (services.json)."""
    pids = list(rank_pids(run_dir).values())
    services = json.loads((run_dir / "services.json").read_text())
    pids += [v for k, v in services.items() if k.endswith("_pid")]
    return pids


SLOW_PAIRS = ["SIGHUP-prague-smart", "SIGTERM-hop"]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "algorithm"), [
    pytest.param(signal.SIGTERM, "prague-smart", id="SIGTERM-prague-smart"),
    pytest.param(signal.SIGHUP, "hop", id="SIGHUP-hop"),
    # The other two pairs run in CI (slow): the same path, each 15 s.
    pytest.param(signal.SIGHUP, "prague-smart", id="SIGHUP-prague-smart", marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, "hop", id="SIGTERM-hop", marks=pytest.mark.slow)])
def test_a_terminating_signal_stops_bench_like_ctrl_c(tmp_path, bench_cmd, cli_env, sig,
                                                      algorithm):
    pair = f"{sig.name}-{algorithm}"
    if pair in SLOW_PAIRS:  # the same path as the other two: one of them a day
        skip_unless_today(pair, SLOW_PAIRS)
    proc, _, _, tag, run_dir = start_bench(tmp_path, bench_cmd, cli_env, algorithm)
    pids = _logged_pids(run_dir)
    assert len(pids) == 4 + (algorithm == "prague-smart")
    assert set(pids) <= set(tagged(tag)), "the tag must reach every rank and service"
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, output
    assert f"interrupted by {sig.name}" in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["cause"] == f"interrupted by {sig.name}"
    assert gone_within(tag, GONE_S) == []


@pytest.mark.slow  # runs of about 15 s each, one a day in turn; CI runs it
@pytest.mark.parametrize("algorithm", ["prague-smart", "hop"])
def test_sigkill_to_bench_leaves_no_process_and_the_rerun_says_so(tmp_path, bench_cmd, cli_env,
                                                                   algorithm):
    skip_unless_today(algorithm, ["prague-smart", "hop"])
    proc, matrix, out, tag, run_dir = start_bench(tmp_path, bench_cmd, cli_env, algorithm)
    proc.kill()
    proc.communicate(timeout=30)
    # Nothing trains on with half its peers: ranks, the forkserver and the Group Generator die
    # with bench.
    assert gone_within(tag, GONE_S) == [], f"alive {GONE_S} s after SIGKILL"
    assert not (run_dir / "summary.json").exists()
    # The next run of the same matrix says what became of the unfinished run and runs it again
    # (stopped here by SIGTERM once it has said so: the run itself would take minutes).
    rerun = subprocess.Popen([*bench_cmd, "run", str(matrix), "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**cli_env, "COLUMNS": "1000"})
    said = next((line for line in rerun.stdout if "did not finish" in line), "")
    rerun.send_signal(signal.SIGTERM)
    rest, _ = rerun.communicate(timeout=60)
    assert "no summary.json: its launcher was killed" in said, said + rest
    assert rerun.returncode == 128 + signal.SIGTERM, rest
    assert len(list((out / ".attempts").iterdir())) == 1


#: Each day one launcher meets SIGTERM and the other SIGKILL, crossed the next day
#: (tests.helpers.rotation_day): two runs of 15-20 s a day instead of four.
#: One launcher a day (alternating), its signal switching every other day: each of the four
#: (launcher, signal) pairs runs within four days.
_DAYS_SIGNALS = ((signal.SIGTERM, signal.SIGKILL), (signal.SIGKILL, signal.SIGTERM))[
    rotation_day() // 2 % 2]


@pytest.mark.slow  # runs of 15-20 s each (the tools start every rank from scratch)
@pytest.mark.parametrize(("launcher", "algorithm", "sig"), [
    pytest.param("torchrun", "hop", _DAYS_SIGNALS[0], id=f"torchrun-hop-{_DAYS_SIGNALS[0].name}"),
    pytest.param("mpi", "hop", _DAYS_SIGNALS[1], id=f"mpi-hop-{_DAYS_SIGNALS[1].name}",
                 marks=needs_mpi)])
def test_signals_under_torchrun_and_mpirun(tmp_path, bench_cmd, cli_env, launcher, algorithm,
                                           sig):
    """torchrun's agent and mpirun sit between bench and the ranks, in a session of their own:
    a stopped bench stops them, a killed bench leaves ranks that exit by themselves, and the
    tools then end the job. Hop has no service: a killed bench's Group Generator would end a
    Prague run's ranks anyway, and this is about the ranks noticing by themselves."""
    skip_unless_today(launcher, ["torchrun", "mpi"])
    proc, _, _, tag, run_dir = start_bench(tmp_path, bench_cmd, cli_env, algorithm, launcher)
    assert len(tagged(tag)) >= 4 + 2  # bench, the tool, the ranks (+ services, helpers)
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    assert gone_within(tag, GONE_S) == [], f"alive {GONE_S} s after {sig.name}"
    if sig == signal.SIGKILL:
        assert not (run_dir / "summary.json").exists()
        return
    assert proc.returncode == 128 + sig, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["cause"] == f"interrupted by {sig.name}"
