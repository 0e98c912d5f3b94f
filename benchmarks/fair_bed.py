"""Kernel-shaped links against `bench sim` with `transport = "fcfs"` and `"fair"` (issue 58):
every protocol of the quick matrix, plus sgp and diloco, on test beds of one-rank hosts at
several link rates.

    python benchmarks/fair_bed.py --hosts 5,8 --rates 100mbit,50mbit \
        --out docs/results/fair-transport-bed.json [--emulate fcfs,fair] [--queues tbf,fair]

For each bed size, rate and queue: a bed of that many hosts with every link shaped (tbf, or
htb's classes: testbed.shape_link's `queue`), the link
measured (testbed.measure), the link-bound matrix run for real across the hosts (torchrun, one
rank a host), then simulated both ways on the measured link, and with --emulate run for real
on this one host under the emulator of each transport named, on the same link. The parameter
servers take a host of their own, so they run hosts - 1 workers; the others run the largest
even count that fits (Prague's groups of two). The bed's hosts share this machine's cores and
compute is emulated (a 20 ms wait): each shaped run's median compute an iteration (20 ms and
the host's lateness in waking a rank) and the host's CPU busy share over its training
iterations (/proc/stat, all cores, the kernel's network work included) say whether the host
kept up. One run per cell; writes `--out` as JSON and prints a line per cell. Needs root and
network namespaces.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bed_probe import workers_on_bed  # noqa: E402

from hetbench import testbed  # noqa: E402
from hetbench.core.store import write_json_atomic  # noqa: E402
from hetbench.testbed.measure import (  # noqa: E402
    STEADY_ITERATIONS,
    link_bound_matrix,
    measure_link,
    network_table,
    run_across,
)

ALGORITHMS = ["allreduce", "ps-sync", "ps-async", "dpsgd", "adpsgd", "hop", "prague-static",
              "prague-smart", "sgp", "diloco"]


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot (/proc/stat is not per namespace), the
    kernel's network work (softirq) included."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


class CpuSampler(threading.Thread):
    """The host's CPU ticks every 0.2 s, stamped with the wall clock the events use, so that
    a run's training iterations (not its start-up) can be told apart."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples: list[tuple[float, int, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append((time.time(), *cpu_ticks()))
            self._stop_event.wait(0.2)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def busy(self, t0: float, t1: float) -> float:
        """The share of all cores busy between wall times t0 and t1 (nan if too short)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return float("nan")
        (_, b0, n0), (_, b1, n1) = inside[0], inside[-1]
        return (b1 - b0) / max(n1 - n0, 1)


def training_window(run_dir: Path) -> tuple[float, float]:
    """Wall seconds from the last rank's start of iteration 5 to the first rank's last end."""
    logs = [[json.loads(line) for line in path.read_text().splitlines()]
            for path in run_dir.glob("events.rank*.jsonl")]
    return (max(log[5]["t_start"] for log in logs) / 1e9,
            min(log[-1]["t_end"] for log in logs) / 1e9)


def summaries(out: Path) -> dict[str, dict]:
    found = {}
    for path in out.glob("*/summary.json"):
        summary = json.loads(path.read_text())
        found[summary["algorithm"]] = summary
    return found


def median_compute_ms(run_dir: Path) -> float:
    """The median iteration's compute over every rank's events: 20 ms of emulated compute
    and the host's lateness in waking the rank (a host that keeps up: about 20)."""
    computes = [event["compute_s"] for path in run_dir.glob("events.rank*.jsonl")
                for event in map(json.loads, path.read_text().splitlines())
                if "compute_s" in event]
    return statistics.median(computes) * 1e3 if computes else float("nan")


def simulate_both(work: Path, matrices: dict[int, Path], link: dict,
                  tag: str) -> dict[str, dict[str, float]]:
    """algorithm -> {transport: throughput}: each of `matrices` (workers -> matrix) simulated
    under fcfs and fair on the measured `link` (runs in `work`, named after `tag`)."""
    simulated: dict[str, dict[str, float]] = {}
    for transport in ("fcfs", "fair"):
        for workers, matrix in matrices.items():
            path = work / f"{tag}-{workers}-{transport}.toml"
            path.write_text(matrix.read_text() + network_table(link, transport=transport))
            out = work / path.stem
            subprocess.run([sys.executable, "-m", "hetbench", "sim", str(path), "--out",
                            str(out)], check=True, capture_output=True, cwd=ROOT)
            for algorithm, summary in summaries(out).items():
                simulated.setdefault(algorithm, {})[transport] = summary["throughput"]
    return simulated


def shaped_run(bed, hosts: int, matrix: Path, out: Path) -> dict:
    """Each algorithm's summary of the matrix run across the bed, with its median compute and
    the host's CPU busy share over its training iterations."""
    sampler = CpuSampler()
    sampler.start()
    done = run_across(bed, hosts, matrix, out)
    sampler.stop()
    if done.returncode:
        raise SystemExit(f"shaped run failed: {done.stderr[-2000:]}")
    found = summaries(out)
    for summary in found.values():
        summary["compute_ms"] = median_compute_ms(out / summary["run_id"])
        summary["cpu_busy"] = sampler.busy(*training_window(out / summary["run_id"]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="5,8")
    parser.add_argument("--rates", default="100mbit,50mbit")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--iterations", type=int, default=STEADY_ITERATIONS,
                        help="past a run's start (the results page's tables: 40 and 120)")
    parser.add_argument("--hidden", type=int, default=1024,
                        help="mlp-digits' hidden units (32768: messages beyond a socket buffer)")
    parser.add_argument("--queue-ms", type=float, default=testbed.SHAPE_QUEUE_MS)
    parser.add_argument("--queues", default=testbed.DEFAULT_QUEUE,
                        help="how the links enforce their rate, each in turn (testbed.QUEUES: "
                             f"{', '.join(testbed.QUEUES)})")
    parser.add_argument("--emulate", default="",
                        help="transports (fcfs,fair) to also run for real on this one host "
                             "under the emulator, on the measured link (`emulated_<transport>`)")
    parser.add_argument("--dilation", type=float, default=1.0,
                        help="the emulated runs' dilation")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    algorithms = args.algorithms.split(",")
    work = Path(tempfile.mkdtemp(prefix="fair-bed-"))
    cells = []
    name = "fbed"
    for hosts in map(int, args.hosts.split(",")):
        groups: dict[int, list[str]] = {}
        for algorithm in algorithms:
            workers = workers_on_bed(algorithm, hosts)
            groups.setdefault(workers, []).append(algorithm)
        matrices = {}
        for workers, members in groups.items():
            if members:
                path = work / f"h{hosts}-w{workers}.toml"
                path.write_text(link_bound_matrix(f"fair-bed-{hosts}", members, workers,
                                                  args.iterations, args.hidden))
                matrices[workers] = path
        for rate, queue in itertools.product(args.rates.split(","), args.queues.split(",")):
            testbed.down(name)
            bed = testbed.up(name, hosts=hosts, subnet="10.77.10")
            shaped = {}
            started = time.time()
            try:
                for host in bed.hosts:
                    testbed.shape_link(bed, host, rate, queue_ms=args.queue_ms, queue=queue)
                link = measure_link(bed)
                for workers, matrix in matrices.items():
                    shaped.update(shaped_run(bed, hosts, matrix,
                                             work / f"shaped-{hosts}-{rate}-{queue}-{workers}"))
            finally:
                testbed.down(name)
            simulated = simulate_both(work, matrices, link, f"sim-{hosts}-{rate}-{queue}")
            emulated: dict[str, dict] = {}
            for transport in filter(None, args.emulate.split(",")):
                for workers, matrix in matrices.items():
                    path = work / f"emu-{hosts}-{rate}-{queue}-{workers}-{transport}.toml"
                    path.write_text(matrix.read_text().replace('bind_host = "0.0.0.0"\n', "")
                                    + network_table(link, transport=transport,
                                                    dilation=args.dilation))
                    out = work / f"emu-{hosts}-{rate}-{queue}-{workers}-{transport}"
                    subprocess.run([sys.executable, "-m", "hetbench", "run", str(path),
                                    "--out", str(out)], check=True, capture_output=True,
                                   cwd=ROOT)
                    for algorithm, summary in summaries(out).items():
                        emulated.setdefault(algorithm, {})[f"emulated_{transport}"] = (
                            summary["throughput"])
                        emulated[algorithm][f"fidelity_{transport}"] = summary.get("fidelity")
                        emulated[algorithm][f"late_share_{transport}"] = round(
                            summary["network"]["late_share"], 4)
            for algorithm in algorithms:
                real = shaped[algorithm]
                cell = {"hosts": hosts, "rate": rate, "queue": queue, "algorithm": algorithm,
                        "workers": real["workers"], "status": real["status"],
                        "shaped": real["throughput"], **simulated[algorithm],
                        "cpu_busy": round(real["cpu_busy"], 3),
                        "compute_ms": round(real["compute_ms"], 2),
                        "link_mbit_s": round(link["payload_gbps"] * 1000, 2),
                        "rtt_us": round(link["rtt_us"], 1)}
                cell["shaped_over_fcfs"] = round(cell["shaped"] / cell["fcfs"], 3)
                cell["shaped_over_fair"] = round(cell["shaped"] / cell["fair"], 3)
                cell.update(emulated.get(algorithm, {}))
                for transport in filter(None, args.emulate.split(",")):
                    cell[f"shaped_over_emulated_{transport}"] = round(
                        cell["shaped"] / cell[f"emulated_{transport}"], 3)
                cells.append(cell)
                print(f"{hosts} hosts {rate} {queue} {algorithm} ({cell['workers']} workers): "
                      f"shaped {cell['shaped']:.0f}, fcfs {cell['fcfs']:.0f}, fair "
                      f"{cell['fair']:.0f} samples/s; shaped/fcfs {cell['shaped_over_fcfs']:.2f}, "
                      f"shaped/fair "
                      f"{cell['shaped_over_fair']:.2f}; compute {cell['compute_ms']:.1f} ms, "
                      f"cpu busy {cell['cpu_busy']:.0%}"
                      + "".join(f"; shaped/emulated {t} "
                                f"{cell[f'shaped_over_emulated_{t}']:.2f} "
                                f"({cell[f'fidelity_{t}']} fidelity)"
                                for t in filter(None, args.emulate.split(","))),
                      flush=True)
            print(f"{hosts} hosts {rate} {queue}: link {link['payload_gbps'] * 1000:.1f} Mbit/s, "
                  f"rtt {link['rtt_us']:.0f} us, {time.time() - started:.0f} s", flush=True)
            if args.out:
                write_json_atomic(args.out, {"command": " ".join(sys.argv), "cells": cells})
    print(f"runs kept in {work}")


if __name__ == "__main__":
    main()
