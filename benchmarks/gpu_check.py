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
5. overhead (issue 44): benchmarks/harness_overhead.py on the GPU: `allreduce` (impl = ddp)
   against plain_ddp.py, ResNet-18 (CIFAR form, synthetic images) at batch 128, 2 ranks sharing
   the GPU, 150 iterations, 5 rounds in rotating order, each run settled (--settle-s 2); with
   `--also DIR` (an older checkout's `hetbench` package, e.g. .old/) a third side, to show
   what a change bought in one sitting.
6. bandwidth: benchmarks/staged_bandwidth.py, a 44.7 MB message every way it can travel.
7. shared: the six-algorithm matrix of issue 44 (ResNet-18 on the digits images, batch 32, 4
   ranks sharing the GPU, 30 iterations, none and prob:5) and its report; with --also, its
   `none` half again under the older checkout (shared-also/).
8. profile: one `allreduce` (impl = ddp) run of step 5's setting with HETBENCH_PROFILE:
   where an iteration's time goes (profile.rank0.txt).

Steps run in the order 1+2 (at once), 5, 6, 7, 3, 8, 4; `--budget-s` skips a step that would
not end in time (a device call is one sitting of a few minutes). Everything lands under --out:
matrix-cuda-<shard>/ and matrix-cpu/ (the runs), checks.json, compute.json, overhead.json,
bandwidth.json, shared/ (with report.md), and each step's log; --bundle copies what matters
into a few files. `--device cpu` runs every step on CPU (both halves of the matrix on CPU), to
check this script before it spends GPU time.
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


SHARED_ALGORITHMS = ["allreduce", "ps-async", "dpsgd", "adpsgd", "hop", "prague-smart"]


def shared_matrix(device: str, quick: bool, slowdowns: list[str]) -> str:
    """Issue 44's matrix: ResNet-18 (CIFAR form) on the digits images, 4 ranks sharing the GPU."""
    return "\n".join([
        f'name = "gpu-shared-{device}"', f"algorithms = {json.dumps(SHARED_ALGORITHMS)}",
        'workloads = ["resnet18"]', "workers = [4]", f"slowdown = {json.dumps(slowdowns)}",
        "seeds = [1]", f"iterations = {10 if quick else 30}", "warmup_iterations = 3",
        f'device = "{device}"', "comm_timeout_s = 60",
        "[workload.resnet18]", 'dataset = "digits"', f"batch_size = {4 if quick else 32}",
        ]) + "\n"


def shared_table(out: Path) -> list[dict]:
    """Per run of the shared matrix: throughput, its ratio to All-Reduce's at the same slowdown,
    the bytes a worker moved per iteration, and the step's time (t_end - t_sync, the part of
    an iteration after compute: the synchronization and the update) per iteration."""
    import statistics

    from hetbench.core.store import read_jsonl
    from hetbench.reports.load import load_runs

    runs = load_runs(out)
    rows = []
    for _, run in runs.iterrows():
        steps = []
        for rank in range(int(run["workers"])):
            events = read_jsonl(Path(run["run_dir"]) / f"events.rank{rank}.jsonl")[0][3:]
            steps += [(e["t_end"] - e["t_start"]) / 1e9 - e["compute_s"] - e["slowdown_s"]
                      for e in events]
            computes = [e["compute_s"] for e in events]
        mb = (run.get("p2p_mb_per_iteration") or 0.0) + (
            run.get("collective_mb_per_iteration") or 0.0)
        step_s = statistics.median(steps) if steps else float("nan")
        rows.append({"algorithm": run["algorithm"], "slowdown": run["slowdown"],
                     "status": run["status"], "throughput": run.get("throughput"),
                     "p2p_mb_per_iteration": run.get("p2p_mb_per_iteration"),
                     "collective_mb_per_iteration": run.get("collective_mb_per_iteration"),
                     "median_step_ms": step_s * 1e3,
                     "median_compute_ms": statistics.median(computes) * 1e3 if computes
                     else None,
                     "mb_per_s_in_step": mb / step_s if step_s == step_s and step_s else None,
                     "staged_p2p_mb_per_s": run.get("staged_p2p_mb_per_s")})
    for row in rows:
        base = next((r["throughput"] for r in rows if r["algorithm"] == "allreduce"
                     and r["slowdown"] == row["slowdown"]), None)
        row["ratio_to_allreduce"] = (row["throughput"] / base if base and row["throughput"]
                                     else None)
    return rows


def save_shared_table(out: Path, name: str) -> str:
    """shared_table of out/name written to out/name.json; its ratios as a check's detail (a
    results tree that cannot be read says so, and the other steps go on)."""
    try:
        table = shared_table(out / name)
    except Exception as exc:
        return f"; table: {type(exc).__name__}: {exc}"
    (out / f"{name}.json").write_text(json.dumps(table, indent=1, default=str))
    return "; ratio to allreduce: " + ", ".join(
        f"{r['algorithm']} {r['slowdown']} {r['ratio_to_allreduce']:.3f}"
        for r in table if r["ratio_to_allreduce"])


def check_timing(out: Path, workload: str, batch: int) -> list[dict]:
    """Rank 1's (compute + slowdown) / compute is 3 at each iteration, and each rank's compute
    is no shorter than the model's own GPU time (the compute table's, one process alone)."""
    import statistics

    from hetbench.core.store import read_jsonl
    from hetbench.reports.load import load_runs

    table = (json.loads((out / "compute.json").read_text())["rows"]
             if (out / "compute.json").exists() else [])  # no compute step: ratio alone
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
        check["ok"] = bool(abs(ratio - 3) < 0.15 and (alone_ms is None
                                                       or shortest >= 0.9 * alone_ms))
        computes = [round(r["compute_ms"], 1) for r in per_rank.values()]
        check["detail"] = (f"rank 1 (compute + slowdown) / compute = {ratio:.3f} (want 3); "
                           f"compute ms per rank {computes} against {alone_ms} ms alone "
                           "(compute table)")
        check.update(per_rank=per_rank, alone_ms=alone_ms)
        checks.append(check)
    return checks


def run_logged(cmd: list[str], log: Path, timeout_s: float, env=None) -> subprocess.Popen:
    return run_logged_in(ROOT, cmd, log, timeout_s, env)


def run_logged_in(cwd: Path, cmd: list[str], log: Path, timeout_s: float,
                  env=None) -> subprocess.Popen:
    print(f"$ {' '.join(cmd)}  (log: {log.name})", flush=True)
    handle = log.open("w")
    proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=cwd,
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
                        "matrix, tests, timing, compute, overhead, bandwidth, shared, profile")
    parser.add_argument("--also", type=Path, help="a directory holding an older hetbench "
                        "package: a third side in overhead, and shared's none half again")
    parser.add_argument("--budget-s", type=float, default=480,
                        help="skip a step that would not end within this many seconds")
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

    def time_left(step: str, needs_s: float) -> bool:
        """Whether `step` (about needs_s seconds) still fits the budget; else a skip is noted."""
        left = args.budget_s - (time.monotonic() - started)
        if step in skip:
            return False
        if left < needs_s:
            checks.append({"check": step, "ok": False,
                           "detail": f"skipped: {left:.0f} s of the budget left, needs ~"
                                     f"{needs_s:.0f} s"})
            return False
        return True

    def saved() -> None:  # after each step: a cut-off sitting keeps what it measured
        (out / "checks.json").write_text(json.dumps(checks, indent=1, default=str))
        if args.bundle:
            bundle(out, args.bundle)

    saved()
    quick = ["--pairs", "2", "--iterations", "10", "--batch", "4"] if args.quick else [
        "--pairs", "5", "--iterations", "150", "--batch", "128"]
    also = ["--also", str(args.also)] if args.also else []
    if time_left("overhead", 60 if args.quick else 150):
        t0 = time.monotonic()
        code = finish(run_logged(
            [py, "benchmarks/harness_overhead.py", "--device", args.device, "--model",
             "resnet18", "--impl", "ddp", "--workers", "2", *quick, *also, "--out", str(out),
             # Settled runs: unsettled, a run right after the other program's ran 20-40% slow
             # (BENCHMARKS.md, the second H100 sitting).
             "--settle-s", "2", "--name", "overhead"], out / "overhead.log", 400, env))
        detail = f"exit {code} in {time.monotonic() - t0:.0f} s"
        ok = False
        if (out / "overhead.json").exists():
            row = json.loads((out / "overhead.json").read_text())["results"][0]
            ok = code == 0 and (args.device != "cuda" or row["median_ratio"] >= 0.98)
            detail += (f"; median ratio {row['median_ratio']:.3f} (goal >= 0.98), pairs "
                       f"{[round(p['ratio'], 3) for p in row['pairs']]}")
            if "also_median_ratio" in row:
                detail += (f"; --also {args.also}: median {row['also_median_ratio']:.3f}, "
                           f"{[round(p['also_ratio'], 3) for p in row['pairs']]}")
        checks.append({"check": "overhead: harness vs plain DDP, resnet18 b128, 2 ranks",
                       "ok": ok, "detail": detail})
        saved()
    if time_left("bandwidth", 30):
        code = finish(run_logged(
            [py, "benchmarks/staged_bandwidth.py", "--device", args.device,
             *(["--mb", "4"] if args.quick else []), "--out", str(out / "bandwidth.json")],
            out / "bandwidth.log", 120, env))
        detail = f"exit {code}"
        if (out / "bandwidth.json").exists():
            rows = json.loads((out / "bandwidth.json").read_text())["rows"]
            detail += "; MB/s " + ", ".join(f"{k} {v['mb_per_s']:.0f}" for k, v in rows.items())
        checks.append({"check": "bandwidth: staged point to point", "ok": code == 0,
                       "detail": detail})
        saved()
    if time_left("shared", 60 if args.quick else 130):
        t0 = time.monotonic()
        (out / "shared.toml").write_text(shared_matrix(args.device, args.quick,
                                                       ["none", "prob:5"]))
        code = finish(run_logged([py, "-m", "hetbench", "run", str(out / "shared.toml"),
                                  "--out", str(out / "shared")], out / "shared.log", 300, env))
        report = subprocess.run([py, "-m", "hetbench", "report", str(out / "shared")],
                                capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
        detail = f"bench run exit {code}, bench report exit {report.returncode}, " \
                 f"{time.monotonic() - t0:.0f} s"
        detail += save_shared_table(out, "shared")
        note = report.returncode == 0 and "Ranks shared a GPU" in (
            out / "shared" / "report.md").read_text()
        checks.append({"check": "shared: six algorithms, 4 ranks on one GPU",
                       "ok": code == 0 and (note or args.device != "cuda"),
                       "detail": detail + f"; shared-GPU note in report.md: {note}"})
        saved()

    timing = None
    if time_left("timing", 25 if args.quick else 50):
        t0 = time.monotonic()
        text, workload, batch = timing_matrix(args.device, args.quick)
        (out / "timing.toml").write_text(text)
        code = finish(run_logged([py, "-m", "hetbench", "run", str(out / "timing.toml"),
                                  "--out", str(out / "timing")], out / "timing.log", 180, env))
        print(f"timing: exit {code} in {time.monotonic() - t0:.0f} s", flush=True)
        timing = (workload, batch)
        if "compute" in skip:
            try:
                checks += check_timing(out, *timing)
            except Exception as exc:
                checks.append({"check": "timing", "ok": False,
                               "detail": f"could not read the runs: {type(exc).__name__}: "
                                         f"{exc}"})
            timing = None
        saved()

    if time_left("profile", 40 if args.quick else 30):
        (out / "profile.toml").write_text("\n".join([
            'name = "gpu-profile"', 'algorithms = ["allreduce"]', 'workloads = ["resnet18"]',
            "workers = [2]", 'slowdown = ["none"]', "seeds = [1]",
            f"iterations = {12 if args.quick else 120}", f'device = "{args.device}"',
            "[algorithm.allreduce]", 'impl = "ddp"', "[workload.resnet18]", "synthetic = true",
            f"batch_size = {4 if args.quick else 128}"]) + "\n")
        code = finish(run_logged([py, "-m", "hetbench", "run", str(out / "profile.toml"),
                                  "--out", str(out / "profile")], out / "profile.log", 120,
                                 {**env, "HETBENCH_PROFILE": "5:5" if args.quick else "60:30"}))
        tables = sorted((out / "profile").glob("*/profile.rank0.txt"))
        if tables:
            (out / "profile.rank0.txt").write_text(tables[0].read_text())
        checks.append({"check": "profile: HETBENCH_PROFILE", "ok": code == 0 and bool(tables),
                       "detail": f"exit {code}; profile.rank0.txt written: {bool(tables)}"})
        saved()

    if args.also and time_left("shared-also", 40 if args.quick else 70):
        (out / "shared-also.toml").write_text(shared_matrix(args.device, args.quick, ["none"]))
        also_env = {**env, "PYTHONPATH": os.pathsep.join([str(args.also.resolve()),
                                                          env["PYTHONPATH"]])}
        # From --out, not the checkout: `python -m` would find this checkout's package first.
        code = finish(run_logged_in(out, [py, "-m", "hetbench", "run",
                                          str(out / "shared-also.toml"), "--out",
                                          str(out / "shared-also")],
                                    out / "shared-also.log", 200, also_env))
        detail = f"exit {code}" + save_shared_table(out, "shared-also")
        checks.append({"check": f"shared-also: the none half under {args.also}",
                       "ok": code == 0, "detail": detail})
        saved()

    if "compute" not in skip and time_left("compute", 120):
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
    """checks.json, compute.json and everything else (final models and profile traces left
    out) as one tarball."""
    import shutil
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("checks.json", "compute.json"):
        if (out / name).exists():
            shutil.copy(out / name, dest / name)
    with tarfile.open(dest / "results.tgz", "w:gz") as tar:
        # Final models and the profiler's Chrome traces (tens of MB) stay behind.
        tar.add(out, arcname="gpu-check", filter=lambda info: None if info.name.endswith(
            ".npy") or (Path(info.name).name.startswith("profile.rank")
                        and info.name.endswith(".json")) else info)


if __name__ == "__main__":
    sys.exit(main())
