"""Runs across hosts on the test bed (issue 43): `bench run --hosts` started on host h1 puts the
ranks on h1, h2 and h3 (network namespaces with their own names and addresses), through torchrun
(a node per host, started by the bed's rsh agent) and through mpirun (the same agent).

Every case is real: namespaces, bench and its ranks as processes on them, gloo over the bed's
bridge. One launcher a day (of torchrun, mpi and slurm, whose case is test_slurm_bed.py's) runs
one of the quick matrix's algorithms, chosen by the day too (tests.helpers.rotation_day), as the
other long suites rotate; the whole matrix is benchmarks/multihost_matrix.py's
(docs/results/2026-11-26-multihost.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hetbench import testbed
from hetbench.core.record import read_events
from hetbench.reports.waits import run_waits
from tests.helpers import (
    ACROSS_HOSTS_MATRIX,
    HALF_MINUTE_CASES,
    LOCKSTEP,
    NEEDS_TEST_BED,
    QUICK_ALGORITHMS,
    cases_of_today,
    final_models,
    is_today,
    rotation_day,
    skip_unless_today,
)

pytestmark = NEEDS_TEST_BED

ROOT = Path(__file__).resolve().parents[2]
SHIFT_S = 0.050
QUICK, DETERMINISTIC = QUICK_ALGORITHMS, LOCKSTEP
MATRIX = 'name = "hosts"\ncomm_timeout_s = 30.0\n' + ACROSS_HOSTS_MATRIX


def todays(algorithms: list[str], offset: int) -> list[str]:
    """One of the quick matrix's algorithms a day: a lockstep one (checked against a local
    run's models) and one of the others on alternate days."""
    day = rotation_day() + offset
    pool = sorted(DETERMINISTIC) if day % 2 == 0 else [a for a in algorithms
                                                        if a not in DETERMINISTIC]
    return [pool[(day // 2) % len(pool)]]


@pytest.fixture(scope="module")
def bed():
    name = f"m{os.getpid() % 100000}"
    testbed.down(name)
    made = testbed.up(name, hosts=3)
    try:
        yield made
    finally:
        testbed.down(name)


@pytest.fixture(scope="module")
def shifted_bed():
    """Two hosts whose h2 reads its clock 50 ms ahead (libfaketime)."""
    if testbed.faketime_library() is None:
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    name = f"s{os.getpid() % 100000}"
    testbed.down(name)
    made = testbed.up(name, hosts=2, subnet="10.77.1", clock_offsets={"h2": SHIFT_S})
    try:
        yield made
    finally:
        testbed.down(name)


def bench_on(bed, host: str, *args: str, env: dict[str, str] | None = None,
             timeout: float = 400) -> subprocess.CompletedProcess:
    """`bench ARGS` run on `host` of the bed, from the checkout (the path every host shares)."""
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    return bed.run(host, ["env", *extra, sys.executable, "-m", "hetbench", *args],
                   capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                   stdin=subprocess.DEVNULL)


def agent(bed) -> str:
    return f"{sys.executable} -m hetbench testbed rsh --name {bed.name}"


def run_across(bed, tmp_path: Path, launcher: str, algorithms: list[str],
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    matrix = tmp_path / "hosts.toml"
    matrix.write_text(MATRIX)
    return bench_on(bed, "h1", "run", str(matrix), "--algorithms", ",".join(algorithms),
                    "--launcher", launcher, "--hosts", "h1:2,h2:2,h3:2",
                    "--rsh-agent", agent(bed), "--out", str(tmp_path / launcher), env=env)


def run_dirs(out: Path) -> dict[str, Path]:
    found = {}
    for summary in out.glob("*/summary.json"):
        found[json.loads(summary.read_text())["algorithm"]] = summary.parent
    return found


@pytest.mark.slow  # across hosts: CI's full run (the quick tier is one host's)
@pytest.mark.parametrize("launcher", ["torchrun", "mpi"])
def test_todays_algorithms_run_across_three_hosts_and_match_one_machine(bed, tmp_path, bench,
                                                                         launcher):
    skip_unless_today(launcher, HALF_MINUTE_CASES)  # one launcher a day (slurm: test_slurm_bed)
    algorithms = todays(QUICK, 0 if launcher == "torchrun" else 1)
    done = run_across(bed, tmp_path, launcher, algorithms)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = run_dirs(tmp_path / launcher)
    assert sorted(runs) == sorted(algorithms)
    for algorithm, run_dir in runs.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "ok", summary["cause"]
        world = summary["world_size"]
        # Ranks fill the hosts in order, two to a host: 0-1 on h1, 2-3 on h2, 4 on h3.
        hosts = {r: json.loads((run_dir / f"done.rank{r}.json").read_text())["clock"]["host"]
                 for r in range(1, world)}
        assert hosts == {r: f"h{r // 2 + 1}" for r in range(1, world)}, algorithm
    # The same matrix on one machine: lockstep protocols end with the same models.
    matrix = tmp_path / "hosts.toml"
    checked = [a for a in algorithms if a in DETERMINISTIC]
    if not checked:
        return
    local = bench("run", matrix, "--algorithms", ",".join(checked), "--out", tmp_path / "local")
    assert local.returncode == 0, local.stderr[-3000:]
    reference = run_dirs(tmp_path / "local")
    for algorithm in checked:
        for mine, theirs in zip(final_models(runs[algorithm], 4),
                                final_models(reference[algorithm], 4), strict=True):
            np.testing.assert_array_equal(mine, theirs, err_msg=algorithm)


def test_each_host_chooses_the_interface_that_reaches_the_rendezvous_host(bed):
    probe = ("from hetbench.comm.interfaces import choose_interface as c; env = {}; "
             "print(c('h1', env), env['GLOO_SOCKET_IFNAME'], env['NCCL_SOCKET_IFNAME'])")
    seen = bed.run("h2", [sys.executable, "-c", probe], capture_output=True, text=True,
                   timeout=60, cwd=ROOT)
    assert seen.stdout.split() == ["10.77.0.2", "eth0", "eth0"], seen.stderr


def test_a_loopback_interface_named_by_the_user_fails_the_run_in_one_line(bed, tmp_path):
    done = run_across(bed, tmp_path, "torchrun", ["allreduce"],
                      env={"GLOO_SOCKET_IFNAME": "lo"})
    assert done.returncode == 1, done.stderr[-2000:]
    (run_dir,) = run_dirs(tmp_path / "torchrun").values()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "GLOO_SOCKET_IFNAME=lo is loopback" in summary["cause"]
    assert "\n" not in summary["cause"] and summary["cause"].startswith("h1: ")


def _straggler_run(bed, out: Path) -> Path:
    """All-Reduce on h1:2,h2:2 with worker 0 a 3x straggler: every other worker waits for it
    at every step, so the waits, their attribution and the steps' ends all compare ranks of
    both hosts."""
    done = bench_on(bed, "h1", "run", "--algorithms", "allreduce", "--workloads", "mlp-digits",
                    "--workers", "4", "--iterations", "40", "--pace-ms", "10",
                    "--slowdown", "det:3@0", "--launcher", "torchrun", "--hosts", "h1:2,h2:2",
                    "--rsh-agent", agent(bed), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = run_dirs(out).values()
    return run_dir


def _end_spreads_ms(run_dir: Path, unshift: dict[int, int]) -> list[float]:
    """Per iteration past the warm-up: how far apart the workers' stamps of its end are
    (All-Reduce's ranks leave a step together), with `unshift` taken off each rank's."""
    events = {r: read_events(run_dir, r)[0] for r in range(4)}
    return [(max(ends) - min(ends)) / 1e6 for k in range(5, len(events[0]))
            for ends in [[events[r][k]["t_end"] - unshift.get(r, 0) for r in range(4)]]]


@pytest.mark.slow
@pytest.mark.skipif(not is_today("clock", HALF_MINUTE_CASES),
                    reason=f"rotated by day: today's is {cases_of_today(HALF_MINUTE_CASES)[0]} "
                           "(HETBENCH_TEST_ALL=1 runs every one)")
def test_a_host_whose_clock_is_50_ms_ahead_changes_no_figure(bed, shifted_bed, tmp_path,
                                                             bench):
    """The shifted host's offset is found within its error bound and taken out: the steps'
    ends line up as on the unshifted bed (where the stamps without alignment would be 50 ms
    apart), the waits are the same within the spread measured between runs
    (docs/results/clock-alignment.md: 2%; allowed here 25%, for a loaded CI machine), and all
    of them are still on the straggler."""
    plain = _straggler_run(bed, tmp_path / "plain")
    shifted = _straggler_run(shifted_bed, tmp_path / "shifted")
    summary = json.loads((shifted / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["clock_hosts"] == 2
    applied = {}
    for rank in (2, 3):  # on h2
        clock = json.loads((shifted / f"done.rank{rank}.json").read_text())["clock"]
        assert clock["aligned"] and clock["host"] == "h2"
        start = clock["start"]
        assert abs(start["offset_ns"] + SHIFT_S * 1e9) <= start["error_ns"] + 1e6, clock
        assert abs(clock["end"]["offset_ns"]) <= clock["end"]["error_ns"] + 1e6, clock
        applied[rank] = start["offset_ns"]
    assert summary["clock_error_ms"] < 5 and abs(summary["clock_offset_ms"] - 50) < 1

    aligned = np.median(_end_spreads_ms(shifted, {}))
    unaligned = np.median(_end_spreads_ms(shifted, applied))
    reference = np.median(_end_spreads_ms(plain, {}))
    assert unaligned > 40, unaligned  # the shift is there in the raw stamps
    assert aligned < reference + 5, (aligned, reference)

    waits = {name: run_waits(run_dir).table for name, run_dir in
             (("plain", plain), ("shifted", shifted))}
    totals = {name: table["wait_s"].sum() for name, table in waits.items()}
    assert abs(totals["shifted"] - totals["plain"]) < 0.25 * totals["plain"], totals
    for name, table in waits.items():
        on_straggler = table[table["waited_on"] == 0]["wait_s"].sum()
        assert on_straggler >= 0.95 * totals[name], (name, table)

    # The report says the clocks were aligned, by how much, and that the bed is one machine.
    report = bench("report", tmp_path / "shifted")
    assert report.returncode == 0, report.stderr
    md = (tmp_path / "shifted" / "report.md").read_text()
    assert "Across hosts (1 run(s), up to 2 hosts)" in md and "offsets up to 50" in md
    assert "spread over test-bed hosts" in md


SSHD_CONFIG = """\
ListenAddress 0.0.0.0
HostKey {dir}/host_key
AuthorizedKeysFile {dir}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PidFile none
"""
SSH_CONFIG = """\
Host *
    IdentityFile {dir}/id
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
"""


@pytest.fixture
def sshd(bed, tmp_path):
    """An OpenSSH server on every host of the bed (root, key only); the ssh config that
    reaches them. Skipped without OpenSSH (apt-get install openssh-server openssh-client)."""
    sshd_path = Path("/usr/sbin/sshd")
    if not sshd_path.exists() or not shutil.which("ssh"):
        pytest.skip("OpenSSH is not installed (apt-get install openssh-server openssh-client)")
    keys = tmp_path / "ssh"
    keys.mkdir()
    for key in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / key)],
                       check=True)
    (keys / "authorized_keys").write_text((keys / "id.pub").read_text())
    (keys / "sshd_config").write_text(SSHD_CONFIG.format(dir=keys))
    (keys / "ssh_config").write_text(SSH_CONFIG.format(dir=keys))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    servers = [bed.popen(host, [str(sshd_path), "-D", "-e", "-f", str(keys / "sshd_config")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for host in bed.hosts]
    try:
        deadline = time.monotonic() + 30
        while bed.run("h1", ["ssh", "-F", str(keys / "ssh_config"), "-o", "BatchMode=yes",
                             "h2", "true"], capture_output=True, timeout=30).returncode != 0:
            assert time.monotonic() < deadline, "sshd did not come up on h2"
            time.sleep(0.2)
        yield f"ssh -F {keys / 'ssh_config'} -o BatchMode=yes"
    finally:
        for server in servers:
            server.kill()
            server.wait()


@pytest.mark.slow
def test_ssh_starts_the_other_hosts_and_a_stopped_run_leaves_nothing_there(bed, sshd,
                                                                          tmp_path):
    """The default kind of agent, for real: ssh to an OpenSSH server on h2 (bench on h1 starts
    h1's node itself). One run to its end; then one stopped by SIGTERM mid-run, whose node on h2
    learns it through ssh closing its stdin and takes its ranks down."""
    skip_unless_today("ssh", HALF_MINUTE_CASES)
    matrix = tmp_path / "hosts.toml"
    matrix.write_text(MATRIX)
    done = bench_on(bed, "h1", "run", str(matrix), "--algorithms", "allreduce", "--launcher",
                    "torchrun", "--hosts", "h1:2,h2:2", "--rsh-agent", sshd, "--out",
                    str(tmp_path / "ok"))
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = run_dirs(tmp_path / "ok").values()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "ok"
    assert json.loads((run_dir / "done.rank3.json").read_text())["clock"]["host"] == "h2"

    long = bed.popen("h1", [sys.executable, "-m", "hetbench", "run", str(matrix),
                            "--algorithms", "allreduce", "--iterations", "20000", "--launcher",
                            "torchrun", "--hosts", "h1:2,h2:2", "--rsh-agent", sshd, "--out",
                            str(tmp_path / "stopped")],
                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                     stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size > 2000 for p in (tmp_path / "stopped").glob(
            "*/events.rank3.jsonl")):
        assert long.poll() is None and time.monotonic() < deadline, long.communicate()
        time.sleep(0.2)
    long.send_signal(signal.SIGTERM)
    assert long.wait(timeout=60) == 128 + signal.SIGTERM, long.stderr.read()[-2000:]
    deadline = time.monotonic() + 30
    while True:  # only sshd itself is left on h2
        pids = subprocess.run(["ip", "netns", "pids", bed.namespace("h2")], capture_output=True,
                              text=True).stdout.split()
        left = [Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ") for p in pids
                if Path(f"/proc/{p}").exists()]
        left = [cmd for cmd in left if "sshd" not in cmd]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, left
