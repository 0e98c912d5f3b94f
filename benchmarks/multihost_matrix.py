"""The launcher matrix across hosts (issue 43): every algorithm of the quick matrix through
`bench run --launcher torchrun|mpi --hosts` on a test bed of three hosts, two ranks a host.

    python benchmarks/multihost_matrix.py --out docs/results/multihost-matrix.json
    python benchmarks/multihost_matrix.py --launchers slurm     # replaces only those rows

For each launcher x algorithm: ok or the failure's cause, the run's wall time (bench's own,
start of the ranks to summary) and throughput, the hosts its ranks ran on, and for the lockstep
protocols whether the final models equal a local run's of the same cell bit for bit. The slurm
rows run on a SLURM cluster in the bed (`bench testbed up --slurm`: slurmctld, slurmdbd, a
slurmd per host), `[slurm] nodes = 3` (two ranks a node, as --hosts). Needs root and network
namespaces, Open MPI's mpirun for the mpi rows (pip install '.[mpi]'), and Debian's SLURM
packages for the slurm rows (hetbench/testbed/slurm.py names them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetbench import testbed  # noqa: E402
from hetbench.core.store import read_json  # noqa: E402

ALGORITHMS = ["allreduce", "ps-sync", "ps-async", "dpsgd", "adpsgd", "hop", "prague-static",
              "prague-smart"]
DETERMINISTIC = {"allreduce", "ps-sync", "dpsgd", "prague-static"}
HOSTS = "h1:2,h2:2,h3:2"
#: matrices/quick.toml's cell without slowdown, shorter, with the final models kept.
MATRIX = """
name = "multihost"
algorithms = ["allreduce", "ps-sync", "ps-async", "dpsgd", "adpsgd", "hop", "prague-static",
              "prague-smart"]
workloads = ["mlp-digits"]
workers = [4]
iterations = 100
pace_ms = 10
seeds = [1]
save_models = true
eval_interval_s = 600.0
bind_host = "0.0.0.0"   # what --hosts sets; SLURM's ranks need it too

[algorithm.prague-static]
workers_per_node = 2

[algorithm.prague-smart]
group_size = 2

[slurm]
nodes = 3
timeout_min = 10
"""


def bench(bed, args: list[str], host: str | None) -> tuple[int, str, float]:
    argv = [sys.executable, "-m", "hetbench", *args]
    start = time.perf_counter()
    if host is None:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT,
                              stdin=subprocess.DEVNULL, timeout=1200)
    else:
        done = bed.run(host, argv, capture_output=True, text=True, cwd=ROOT,
                       stdin=subprocess.DEVNULL, timeout=1200)
    return done.returncode, done.stderr[-2000:], time.perf_counter() - start


def runs_by_algorithm(out: Path) -> dict[str, Path]:
    return {read_json(p)["algorithm"]: p.parent for p in out.glob("*/summary.json")}


def models(run_dir: Path) -> list[np.ndarray]:
    return [np.load(run_dir / f"model.rank{r}.npy") for r in range(4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results/multihost-matrix.json")
    parser.add_argument("--launchers", default="torchrun,mpi,slurm")
    args = parser.parse_args()
    launchers = args.launchers.split(",")
    rows = []
    if args.out.exists():  # rows of the launchers not rerun stay
        rows = [r for r in json.loads(args.out.read_text())["rows"]
                if r["launcher"] not in launchers]
    bed = testbed.up("mhm", hosts=3, subnet="10.79.2", slurm="slurm" in launchers)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            matrix = Path(tmp) / "multihost.toml"
            matrix.write_text(MATRIX)
            code, err, _ = bench(None, ["run", str(matrix), "--out", f"{tmp}/local"], None)
            if code != 0:
                raise SystemExit(f"local reference failed: {err}")
            local = runs_by_algorithm(Path(tmp) / "local")
            agent = f"{sys.executable} -m hetbench testbed rsh --name {bed.name}"
            for launcher in launchers:
                out = Path(tmp) / launcher
                where = (["--launcher", "slurm"] if launcher == "slurm" else
                         ["--launcher", launcher, "--hosts", HOSTS, "--rsh-agent", agent])
                code, err, wall_s = bench(bed, ["run", str(matrix), *where, "--out", str(out)],
                                          "h1")
                print(f"{launcher}: exit {code} in {wall_s:.0f} s", flush=True)
                for algorithm, run_dir in sorted(runs_by_algorithm(out).items()):
                    summary = read_json(run_dir / "summary.json")
                    hosts = sorted({(read_json(run_dir / f"done.rank{r}.json").get("clock")
                                     or {}).get("host") for r in range(summary["world_size"])
                                    if (run_dir / f"done.rank{r}.json").exists()} - {None})
                    same = None
                    if algorithm in DETERMINISTIC and summary["status"] == "ok":
                        same = all(np.array_equal(a, b) for a, b in
                                   zip(models(run_dir), models(local[algorithm]), strict=True))
                    row = {"launcher": launcher, "algorithm": algorithm,
                           "status": summary["status"], "cause": summary.get("cause"),
                           "world_size": summary["world_size"], "hosts": hosts,
                           "wall_s": summary["wall_s"], "throughput": summary["throughput"],
                           "local_throughput": read_json(
                               local[algorithm] / "summary.json")["throughput"],
                           "same_models_as_local": same}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    finally:
        testbed.down("mhm")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"hosts": HOSTS, "matrix": MATRIX, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
