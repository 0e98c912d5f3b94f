"""A real SLURM cluster inside a test bed (issue 43): `bench testbed up --slurm`.

slurmctld and slurmdbd run on the bed's first host, a slurmd on every host (each in its host's
namespace, with its hostname), munged in the root namespace (its socket is a file every
namespace sees), and a MariaDB server for slurmdbd, so that job states are real: submitit reads
them through sacct, which without accounting reports every job UNKNOWN. Every command run on a
host of such a bed (`bench testbed exec`, the bed's rsh agent) gets SLURM_CONF, so `bench run
--launcher slurm` there submits to the cluster:

    bench testbed up --hosts 2 --slurm
    bench testbed exec h1 -- bench run MATRIX --launcher slurm      # [slurm] nodes = 2
    bench testbed down

Needs Debian's munge, slurmctld, slurmd, slurm-client, slurmdbd and mariadb-server (SLURM
22.05 here); shared/MULTIHOST.md has the recipe this follows. Everything lives in
/run/hetbench-testbed/<bed>-slurm/ and goes with the bed (hetbench/testbed/__init__.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hetbench.errors import UserError

if TYPE_CHECKING:
    from hetbench.testbed import Bed

PACKAGES = "munge slurmctld slurmd slurm-client slurmdbd mariadb-server"
BINARIES = ("munged", "slurmctld", "slurmd", "slurmdbd", "sacctmgr", "sinfo", "sbatch",
            "mariadbd", "mariadb-install-db", "mariadb")
#: MariaDB's socket where SLURM's MySQL client looks for it (host "localhost").
MYSQL_SOCKET = Path("/run/mysqld/mysqld.sock")
#: How long the cluster may take to come up (every node idle).
READY_S = 60.0
DB_PASSWORD = "hetbench-bed"  # a socket-only server inside the bed's directory


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.exists()),
        None)


def check_installed() -> None:
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        raise UserError(f"testbed --slurm: {', '.join(missing)} not found; apt-get install "
                        f"{PACKAGES}")


def slurm_conf(bed: Bed, root: Path) -> str:
    head, head_address = next(iter(bed.hosts.items()))
    nodes = "\n".join(f"NodeName={host} NodeAddr={address} CPUs={os.cpu_count() or 1} "
                      "RealMemory=1000 State=UNKNOWN" for host, address in bed.hosts.items())
    return f"""\
ClusterName={bed.name}
SlurmctldHost={head}({head_address})
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={head_address}
JobCompType=jobcomp/none
{nodes}
PartitionName=bed Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def slurmdbd_conf(bed: Bed, root: Path) -> str:
    head, head_address = next(iter(bed.hosts.items()))
    return f"""\
AuthType=auth/munge
DbdAddr={head_address}
DbdHost={head}
SlurmUser=root
PidFile={root}/slurmdbd.pid
LogFile={root}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass={DB_PASSWORD}
StorageLoc=slurm_acct_db
"""


def up(bed: Bed, root: Path) -> dict:
    """Start the cluster on `bed`, its files in `root`; its record (what `down` stops) grows
    in bed.slurm as it starts, so that a failure half-way is undone by the bed's down()."""
    check_installed()
    for sub in ("state", "log", "mysql", *(f"spool/{h}" for h in bed.hosts)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(bed, root))
    (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    dbd = root / "slurmdbd.conf"
    dbd.write_text(slurmdbd_conf(bed, root))
    dbd.chmod(0o600)  # slurmdbd refuses a readable one (it holds the database password)
    record = bed.slurm = {"conf": str(conf), "pids": [], "dir": str(root)}
    env = {**os.environ, "SLURM_CONF": str(conf)}
    head = next(iter(bed.hosts))

    def daemon(argv: list[str], log: str, host: str | None = None) -> subprocess.Popen:
        with open(root / "log" / log, "ab") as out:
            proc = (subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True) if host is None else
                    bed.popen(host, argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True))
        record["pids"].append(proc.pid)
        return proc

    _start_munge(record)
    _start_mariadb(root, daemon)
    record["mariadb"] = True
    daemon([_which("slurmdbd"), "-D"], "slurmdbd.out", head)
    _wait(lambda: bed.run(head, [_which("sacctmgr"), "-i", "add", "cluster", bed.name],
                          env=env, capture_output=True).returncode == 0,
          "slurmdbd did not answer sacctmgr", root)
    daemon([_which("slurmctld"), "-D", "-f", str(conf)], "slurmctld.out", head)
    for host in bed.hosts:
        daemon([_which("slurmd"), "-D", "-f", str(conf), "-N", host], f"slurmd-{host}.out",
               host)

    def idle() -> bool:
        states = bed.run(head, [_which("sinfo"), "-h", "-N", "-o", "%T"], env=env,
                         capture_output=True, text=True).stdout.split()
        return len(states) == len(bed.hosts) and all(s == "idle" for s in states)

    _wait(idle, "the nodes did not all come up idle", root)
    return record


def _start_munge(record: dict) -> None:
    """munged in the root namespace, unless one runs already (then it is left alone)."""
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
        return
    Path("/run/munge").mkdir(exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    proc = subprocess.Popen(["runuser", "-u", "munge", "--", _which("munged"), "--foreground"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    record["pids"].append(proc.pid)
    _wait(lambda: Path("/run/munge/munge.socket.2").exists(), "munged did not start", None)


def _start_mariadb(root: Path, daemon) -> None:
    if MYSQL_SOCKET.exists():
        raise UserError(f"testbed --slurm: {MYSQL_SOCKET} exists (a MariaDB server runs on this "
                        "machine already); the bed's slurmdbd needs its own there")
    data = root / "mysql"
    done = subprocess.run([_which("mariadb-install-db"), "--user=root", f"--datadir={data}",
                           "--auth-root-authentication-method=socket", "--skip-test-db"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mariadb-install-db: {done.stderr.strip()[-300:]}")
    MYSQL_SOCKET.parent.mkdir(exist_ok=True)
    daemon([_which("mariadbd"), "--user=root", f"--datadir={data}", "--skip-networking",
            f"--socket={MYSQL_SOCKET}", f"--pid-file={root}/mariadb.pid"], "mariadb.out")
    _wait(MYSQL_SOCKET.exists, "MariaDB did not start", root)
    sql = (f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{DB_PASSWORD}'; "
           "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;")
    done = subprocess.run([_which("mariadb"), f"--socket={MYSQL_SOCKET}", "-uroot", "-e", sql],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"MariaDB: {done.stderr.strip()[-300:]}")


def _wait(ready, what: str, root: Path | None) -> None:
    deadline = time.monotonic() + READY_S
    while not ready():
        if time.monotonic() > deadline:
            logs = ""
            if root is not None:
                tails = [f"{p.name}: {p.read_text(errors='replace').strip()[-200:]}"
                         for p in sorted((root / "log").glob("*")) if p.stat().st_size]
                logs = " | ".join(tails)[-800:]
            raise RuntimeError(f"{what} in {READY_S:.0f} s" + (f" ({logs})" if logs else ""))
        time.sleep(0.2)


def down(record: dict | None) -> None:
    """Stop every daemon the cluster started, remove its files (the bed's down() has killed
    whatever ran in its namespaces: slurmd's job steps too)."""
    if not record:
        return
    pids = list(record.get("pids", []))
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
    if record.get("dir"):
        shutil.rmtree(record["dir"], ignore_errors=True)
    if record.get("mariadb"):  # ours: nobody else's socket is removed
        MYSQL_SOCKET.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return Path(f"/proc/{pid}").exists()
    return done == 0


