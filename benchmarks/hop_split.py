"""Where Hop's point-to-point step goes on a shared GPU, beside D-PSGD's on the same bytes
(issue 54): host copies, gloo's transfer, and the waits of the serving threads.

    python3 benchmarks/hop_split.py --out DIR [--device cuda] [--iterations 40]

Runs `bench run` once per algorithm (ResNet-18's CIFAR form on the digits images, batch 32,
4 ranks sharing the GPU, no slowdown: the shared matrix of benchmarks/p2p_sides.py) with the
probe of benchmarks/p2p_probe loaded into every rank, then matches each message's send with
its receive (the k-th message from a to b on a tag is the k-th received there, since gloo
keeps a pair's order) on the one host clock all ranks share. Per message:

- waited for the sender: the receive was posted before the send (the serving thread idle);
- waited for the receiver: the send was posted before its receive (the message waited for a
  serving thread busy with an earlier one, or a main thread not yet in its step);
- transfer: from the later of the two posts to the receive's completion (gloo's own time).

Per step: its milliseconds; Hop's send (the message built on the GPU and staged per
neighbour) and its two waits; the GPU -> host copies' host milliseconds; the host -> GPU
copies' milliseconds in the stream's queue before they ran, and their GPU time. Writes
DIR/hop_split.json and prints the medians. `--device cpu --quick` checks it on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_STEPS = 5  # the first iterations: allocations, cuDNN's choices, the receivers' start


def matrix(algorithm: str, device: str, iterations: int, quick: bool) -> str:
    return "\n".join([
        f'name = "hop-split-{algorithm}"', f'algorithms = ["{algorithm}"]',
        'workloads = ["resnet18"]', "workers = [4]", 'slowdown = ["none"]', "seeds = [1]",
        f"iterations = {iterations}", "warmup_iterations = 3", f'device = "{device}"',
        "comm_timeout_s = 60", "[workload.resnet18]", 'dataset = "digits"',
        f"batch_size = {4 if quick else 32}"]) + "\n"


def run(algorithm: str, out: Path, args) -> Path:
    probe = out / f"probe-{algorithm}"
    probe.mkdir(parents=True, exist_ok=True)
    toml = out / f"{algorithm}.toml"
    toml.write_text(matrix(algorithm, args.device, args.iterations, args.quick))
    env = dict(os.environ, HETBENCH_P2P_PROBE=str(probe),
               PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks" / "p2p_probe"), str(ROOT),
                                           os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "hetbench", "run", str(toml), "--out",
                           str(out / f"results-{algorithm}")], env=env, capture_output=True,
                          text=True, timeout=args.timeout_s)
    print(done.stdout[-600:], done.stderr[-1500:], sep="\n", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"bench run of {algorithm} failed (exit {done.returncode})")
    return probe


def lines(probe: Path) -> list[dict]:
    records = []
    for path in sorted(probe.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut off at the end
                records.append(json.loads(line))
    return records


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def messages(records: list[dict]) -> list[dict]:
    """Each model-sized message's send matched with its receive (ms on the shared clock)."""
    size = max((r["n"] for r in records if r["k"] in ("send", "recv")), default=0)
    sends, recvs = defaultdict(list), defaultdict(list)
    for r in records:
        if r["k"] == "send" and r["n"] == size:
            sends[(r["rank"], r["peer"], r["tag"])].append(r)
        elif r["k"] == "recv" and r["n"] == size and r.get("done") is not None:
            recvs[(r["peer"], r["rank"], r["tag"])].append(r)
    matched = []
    for key, sent in sends.items():
        got = sorted(recvs.get(key, []), key=lambda r: r["done"])
        for s, r in zip(sorted(sent, key=lambda r: r["post"]), got, strict=False):
            begin = max(s["post"], r["post"])
            matched.append({
                "waited_for_sender_ms": max(0, s["post"] - r["post"]) / 1e6,
                "waited_for_receiver_ms": max(0, r["post"] - s["post"]) / 1e6,
                "transfer_ms": (r["done"] - begin) / 1e6,
                "receiver_thread": r["thread"]})
    return matched


def split(records: list[dict]) -> dict:
    steps = [r for r in records if r["k"] == "step" and (r["iteration"] or 0) > SKIP_STEPS]
    hop_sends = [r for r in records if r["k"] == "hop_send"]
    waits = defaultdict(list)
    for r in records:
        if r["k"] == "hop_wait":
            waits[r["what"]].append(r["ms"])
    matched = messages(records)[SKIP_STEPS * 8:]
    d2h = [r["host_ms"] for r in records if r["k"] == "d2h"]
    h2d = [r for r in records if r["k"] == "h2d"]
    per_step = max(1, len(steps))
    return {
        "steps": len(steps), "step_ms": median(r["ms"] for r in steps),
        "hop_send_ms": median(r["ms"] for r in hop_sends),
        **{f"hop_wait_{what.replace(' ', '_')}_ms": median(v) for what, v in waits.items()},
        "messages": len(matched),
        "waited_for_sender_ms": median(m["waited_for_sender_ms"] for m in matched),
        "waited_for_receiver_ms": median(m["waited_for_receiver_ms"] for m in matched),
        "transfer_ms": median(m["transfer_ms"] for m in matched),
        "d2h_copies_per_step": round(len(d2h) / per_step, 2) if steps else None,
        "d2h_host_ms": median(d2h),
        "h2d_queue_ms": median(r["queue_ms"] for r in h2d),
        "h2d_gpu_ms": median(r["gpu_ms"] for r in h2d),
        "h2d_from_threads": sorted({r["copy_thread"] for r in h2d}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--algorithms", default="dpsgd,hop")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny batches (a CPU check)")
    parser.add_argument("--timeout-s", type=float, default=150)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {}
    for algorithm in args.algorithms.split(","):
        result[algorithm] = split(lines(run(algorithm, args.out, args)))
        (args.out / "hop_split.json").write_text(json.dumps(result, indent=1) + "\n")
        print(algorithm, json.dumps(result[algorithm]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
