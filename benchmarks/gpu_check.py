"""The GPU checks in one run, for a machine with one (or more) GPUs; a pass/fail line each.

    PYTHONPATH=. python3 benchmarks/gpu_check.py --out DIR            # on the GPU machine
    PYTHONPATH=. python3 benchmarks/gpu_check.py --out DIR --device cpu --quick  # its own check

1. matrix: every registered algorithm, 2 workers on mlp-digits (the quick matrix's pace and
   target, 100 iterations), once with device = "cuda" (both
   ranks share the GPU when there is one: gloo, point to point through host memory) and once
   with device = "cpu", side by side. Each run must end ok with its ranks on the device asked
   for; where the protocol is deterministic (no decision depends on timing) the final models
   must equal the CPU run's within float tolerance.
2. tests: tests/distributed/test_gpu.py (what one GPU allows; the multi-GPU NCCL tests skip
   with a reason naming the GPU count).
3. timing: real compute with a fixed 3x straggler, both places compute can end (after
   backward, inside DDP's backward): the straggler's compute + slowdown is 3x its compute, and
   no rank's compute is shorter than the model's own GPU time.
4. compute: benchmarks/gpu_compute.py, the papers' models' per-iteration compute.

Everything lands under --out: matrix-cuda-<shard>/ and matrix-cpu/ (the runs), checks.json,
compute.json, and each step's log; --bundle copies what matters into a few files. `--device cpu`
runs every step on CPU (both halves of the matrix on CPU), to check this script before it spends
GPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Whose final models must equal the CPU run's: every decision fixed by the seed, none by
#: timing. The others pick partners, skip, drop or go stale by who is first.
DETERMINISTIC = {"allreduce", "ps-sync", "dpsgd", "diloco", "sgp", "local-sgd",
                 "prague-static"}
#: Options that make an algorithm valid at 2 workers, where its default needs more.
#: allreduce both ways: its own buckets on Comm, and torch DDP (which calls the process group
#: itself, on CUDA tensors, whatever the backend).
TWO_WORKER_OPTIONS = {
    "allreduce": {"impl": ["buckets", "ddp"]},
    "prague-static": {"workers_per_node": 2},
    "prague-smart": {"group_size": 2},
    "prague-random": {"group_size": 2},
    "hop": {"backup_workers": 0},  # a ring of 2 has in-degree 1
}
RTOL, ATOL = 1e-4, 1e-5


def matrix_text(device: str, algorithms: list[str], iterations: int) -> str:
    lines = [f'name = "gpu-check-{device}"',
             f"algorithms = {json.dumps(algorithms)}",
             'workloads = ["mlp-digits"]', "workers = [2]", 'slowdown = ["none"]', "seeds = [3]",
             f"iterations = {iterations}", "warmup_iterations = 2", f'device = "{device}"',
             "save_models = true", "comm_timeout_s = 20",
             # As the quick matrix: its pace floor, and its target (the search for the moment
             # it was met sends every worker's models to rank 0: point to point).
             "pace_ms = 10", 'target = "accuracy:0.85"']
    for name, options in TWO_WORKER_OPTIONS.items():
        if name in algorithms:
            lines.append(f"[algorithm.{name}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in options.items()]
    return "\n".join(lines) + "\n"


def timing_matrix(device: str, quick: bool) -> tuple[str, str, int]:
    """Real compute with a fixed 3x straggler (rank 1), through the harness's two places compute
    can end: after backward (impl = buckets) and inside DDP's backward (impl = ddp). The
    model is GPU-bound (ResNet-200's CIFAR form, 128 images): its kernels run well after the
    host has queued them, so a compute time read without waiting for them comes out short."""
    workload, batch = ("resnet18", 4) if quick else ("resnet200", 128)
    text = "\n".join([
        f'name = "gpu-timing-{device}"', 'algorithms = ["allreduce"]',
        f'workloads = ["{workload}"]', "workers = [2]", 'slowdown = ["det:3@1"]', "seeds = [1]",
        f"iterations = {4 if quick else 20}", "warmup_iterations = 2", f'device = "{device}"',
        "comm_timeout_s = 60",
        "[algorithm.allreduce]", 'impl = ["buckets", "ddp"]',
        f"[workload.{workload}]", "synthetic = true", f"batch_size = {batch}"]) + "\n"
    return text, workload, batch


def check_timing(out: Path, workload: str, batch: int) -> list[dict]:
    """Rank 1's (compute + slowdown) / compute is 3 at each iteration, and each rank's compute
    is no shorter than the model's own GPU time (the compute table's, one process alone)."""
    import statistics

    from hetbench.core.store import read_jsonl
    from hetbench.reports.load import load_runs

    table = json.loads((out / "compute.json").read_text())["rows"]
    alone_ms = next((r["median_ms"] for r in table if r["workload"] == workload
                     and r["input"] == "cifar10-32" and r["batch"] == batch
                     and "median_ms" in r), None)
    checks = []
    for _, run in load_runs(out / "timing").iterrows():
        check = {"check": f"timing {run['algorithm']} {workload} det:3@1", "ok": False}
        if run["status"] != "ok":
            check["detail"] = f"run {run['status']}: {run.get('cause')}"
            checks.append(check)
            continue
        per_rank = {}
        for rank in (0, 1):
            events = read_jsonl(Path(run["run_dir"]) / f"events.rank{rank}.jsonl")[0][2:]
            per_rank[rank] = {
                "compute_ms": statistics.median(e["compute_s"] for e in events) * 1e3,
                "ratio": statistics.median((e["compute_s"] + e["slowdown_s"]) / e["compute_s"]
                                           for e in events)}
        ratio = per_rank[1]["ratio"]
        shortest = min(r["compute_ms"] for r in per_rank.values())
        check["ok"] = bool(abs(ratio - 3) < 0.15 and alone_ms is not None
                           and shortest >= 0.9 * alone_ms)
        computes = [round(r["compute_ms"], 1) for r in per_rank.values()]
        check["detail"] = (f"rank 1 (compute + slowdown) / compute = {ratio:.3f} (want 3); "
                           f"compute ms per rank {computes} against {alone_ms} ms alone "
                           "(compute table)")
        check.update(per_rank=per_rank, alone_ms=alone_ms)
        checks.append(check)
    return checks


def run_logged(cmd: list[str], log: Path, timeout_s: float, env=None) -> subprocess.Popen:
    print(f"$ {' '.join(cmd)}  (log: {log.name})", flush=True)
    handle = log.open("w")
    proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=env or os.environ.copy(), start_new_session=True)
    proc.deadline = time.monotonic() + timeout_s  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen) -> int:
    """Its exit code; killed (with its children) at its deadline: -9."""
    try:
        return proc.wait(timeout=max(1.0, proc.deadline - time.monotonic()))  # type: ignore
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        return -9


def compare_matrix(out: Path, gpu_device: str) -> list[dict]:
    import numpy as np

    from hetbench.reports.load import load_runs

    halves: dict[str, dict] = {"cuda": {}, "cpu": {}}
    for tree in sorted(out.glob("matrix-*/")):
        runs = load_runs(tree)
        half = "cpu" if tree.name == "matrix-cpu" else "cuda"
        halves[half].update({row["algorithm"]: row for _, row in runs.iterrows()})
    checks = []
    for name in sorted(set(halves["cuda"]) | set(halves["cpu"])):
        gpu, cpu = halves["cuda"].get(name), halves["cpu"].get(name)
        check = {"check": f"matrix {name}", "ok": False}
        if gpu is None or cpu is None:
            check["detail"] = "no run recorded"
            checks.append(check)
            continue
        check.update(cuda_status=gpu["status"], cpu_status=cpu["status"],
                     cuda_backend=gpu.get("backend"), cuda_devices=gpu.get("devices"),
                     cuda_throughput=gpu.get("throughput"),
                     cpu_throughput=cpu.get("throughput"),
                     cuda_accuracy=gpu.get("final_test_accuracy"),
                     cpu_accuracy=cpu.get("final_test_accuracy"))
        if gpu["status"] != "ok" or cpu["status"] != "ok":
            check["detail"] = f"cuda: {gpu.get('cause')}; cpu: {cpu.get('cause')}"
            checks.append(check)
            continue
        devices = gpu.get("devices")
        on_device = isinstance(devices, list) and devices and all(
            str(d).startswith(gpu_device) for d in devices[:2])
        deterministic = gpu["algorithm_name"] in DETERMINISTIC
        models = []
        for half in ("cuda", "cpu"):
            run_dir = Path((gpu if half == "cuda" else cpu)["run_dir"])
            models.append([np.load(run_dir / f"model.rank{r}.npy") for r in range(2)])
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(*models, strict=True))
        close = all(np.allclose(a, b, rtol=RTOL, atol=ATOL) for a, b in zip(*models,
                                                                              strict=True))
        finite = all(np.isfinite(m).all() for half in models for m in half)
        check.update(max_abs_diff=diff, models_compared=deterministic)
        check["ok"] = bool(on_device and finite and (close or not deterministic))
        check["detail"] = (
            ("" if on_device else f"ranks not on {gpu_device}: {devices}; ")
            + (f"final models {'equal' if close else 'DIFFER'} within rtol {RTOL}, atol {ATOL}"
               if deterministic else
               "timing-dependent protocol: final models finite, not compared")
            + f" (max |diff| {diff:.2e})")
        checks.append(check)
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: every step on CPU, to check this script")
    parser.add_argument("--quick", action="store_true",
                        help="three algorithms, a tiny compute table (the CPU check)")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--shards", type=int, default=2,
                        help="the device half of the matrix as this many concurrent bench runs")
    parser.add_argument("--skip", default="", help="comma-separated steps to skip: "
                        "matrix, tests, timing, compute")
    parser.add_argument("--bundle", type=Path,
                        help="also copy checks.json, compute.json and a tarball of the rest "
                             "(models left out) here: what a device call brings back")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    py = sys.executable
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "PYTHONUNBUFFERED": "1"}

    import torch

    from hetbench.core.registry import ALGORITHMS

    gpus = torch.cuda.device_count()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpus} GPU(s)"
          + (f": {torch.cuda.get_device_name(0)}" if gpus else ""), flush=True)
    if args.device == "cuda" and not gpus:
        print("FAIL setup: no CUDA device", flush=True)
        return 1
    algorithms = (["allreduce", "dpsgd", "hop"] if args.quick
                  else sorted(ALGORITHMS.names()))
    checks: list[dict] = []
    started = time.monotonic()

    # Correctness first, all at once (the matrix's halves and the tests share the GPU and the
    # cores); then the compute table alone on the GPU, so that nothing else skews its timings.
    procs = {}
    if "matrix" not in skip:
        shards = [algorithms[i::args.shards] for i in range(args.shards)]
        halves = [(f"cuda-{i}", args.device, shard) for i, shard in enumerate(shards)]
        for half, device, names in [*halves, ("cpu", "cpu", algorithms)]:
            matrix = out / f"matrix-{half}.toml"
            matrix.write_text(matrix_text(device, names, args.iterations))
            procs[half] = run_logged([py, "-m", "hetbench", "run", str(matrix), "--out",
                                      str(out / f"matrix-{half}")],
                                     out / f"matrix-{half}.log", 300, env)
    if "tests" not in skip:
        procs["tests"] = run_logged([py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                                     "-m", "gpu", "tests/distributed/test_gpu.py"],
                                    out / "tests.log", 300, env)
    codes = {name: finish(proc) for name, proc in procs.items()}
    print(f"exit codes {codes} after {time.monotonic() - started:.0f} s", flush=True)

    if "matrix" not in skip:
        runs = {k: v for k, v in codes.items() if k != "tests"}
        checks.append({"check": "matrix: bench run", "ok": set(runs.values()) == {0},
                       "detail": f"exit codes {runs} (logs: matrix-*.log)"})
        try:
            checks += compare_matrix(out, args.device)
        except Exception as exc:  # a broken results tree must not lose the other steps
            checks.append({"check": "matrix", "ok": False,
                           "detail": f"could not read the runs: {type(exc).__name__}: {exc}"})
        report = subprocess.run([py, "-m", "hetbench", "report", str(out / "matrix-cuda-0")],
                                capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
        text = (out / "matrix-cuda-0" / "report.md").read_text() if report.returncode == 0 \
            else report.stderr[-300:]
        shown = "| backend | devices |" in text and (args.device != "cuda" or "cuda:0" in text)
        checks.append({"check": "report metadata names backend and devices",
                       "ok": report.returncode == 0 and shown,
                       "detail": f"bench report exit {report.returncode}"})
    if "tests" not in skip:
        tail = (out / "tests.log").read_text().strip().splitlines()[-6:]
        checks.append({"check": "tests/distributed/test_gpu.py", "ok": codes["tests"] == 0,
                       "detail": f"exit {codes['tests']}: " + " | ".join(tail)})

    timing = None
    if "timing" not in skip:
        t0 = time.monotonic()
        text, workload, batch = timing_matrix(args.device, args.quick)
        (out / "timing.toml").write_text(text)
        code = finish(run_logged([py, "-m", "hetbench", "run", str(out / "timing.toml"),
                                  "--out", str(out / "timing")], out / "timing.log", 180, env))
        print(f"timing: exit {code} in {time.monotonic() - t0:.0f} s", flush=True)
        timing = (workload, batch)

    if "compute" not in skip:
        t0 = time.monotonic()
        cmd = [py, "benchmarks/gpu_compute.py", "--device", args.device,
               "--out", str(out / "compute.json")]
        if args.quick:
            cmd += ["--quick", "--warmup", "1", "--iterations", "2"]
        code = finish(run_logged(cmd, out / "compute.log", 240, env))
        checks.append({"check": "compute table", "ok": code == 0,
                       "detail": f"exit {code} in {time.monotonic() - t0:.0f} s"})
    if timing is not None:
        try:
            checks += check_timing(out, *timing)
        except Exception as exc:
            checks.append({"check": "timing", "ok": False,
                           "detail": f"could not read the runs: {type(exc).__name__}: {exc}"})

    (out / "checks.json").write_text(json.dumps(checks, indent=1, default=str))
    for check in checks:
        print(f"{'PASS' if check['ok'] else 'FAIL'} {check['check']}: {check.get('detail', '')}")
    print(f"{sum(c['ok'] for c in checks)} of {len(checks)} checks passed in "
          f"{time.monotonic() - started:.0f} s")
    if (out / "compute.log").exists():
        print((out / "compute.log").read_text()[-4000:])
    if args.bundle:
        bundle(out, args.bundle)
    return 0 if all(c["ok"] for c in checks) else 1


def bundle(out: Path, dest: Path) -> None:
    """checks.json, compute.json and everything else (final models left out) as one tarball."""
    import shutil
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("checks.json", "compute.json"):
        if (out / name).exists():
            shutil.copy(out / name, dest / name)
    with tarfile.open(dest / "results.tgz", "w:gz") as tar:
        tar.add(out, arcname="gpu-check",
                filter=lambda info: None if info.name.endswith(".npy") else info)


if __name__ == "__main__":
    sys.exit(main())
