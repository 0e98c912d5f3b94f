"""What a reader must know before trusting a report's numbers, and where each run was measured:
the notes at the top of every report (unreadable or running runs, one host, an emulated network)
and the run-metadata table at its end."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pandas as pd

from hetbench.core.launchers import DEFAULT_LAUNCHER, KINDS
from hetbench.core.variants import base_name
from hetbench.reports.load import Scan, load_env


def reading_notes(scan: Scan | None) -> list[str]:
    """Runs left out of every table (unreadable files, or still running) and runs read with
    unreadable lines skipped: the reader must know the report is not the whole directory."""
    if scan is None:
        return []
    notes = []
    if scan.unreadable:
        notes.append(f"Left out, unreadable ({len(scan.unreadable)} run(s)): "
                     + "; ".join(f"{u.run_id}: {u.why}" for u in scan.unreadable) + ".")
    if scan.torn_lines:
        notes.append("Unreadable event lines skipped: " + ", ".join(
            f"{run_id}: {n}" for run_id, n in sorted(scan.torn_lines.items())) + ".")
    if note := scan.progress_note():
        notes.append(note)
    return notes


def host_notes(runs: pd.DataFrame) -> list[str]:
    """Real runs on one host without a network model measure that host: say so, with how many
    ranks shared how many cores, and point to a cluster's costs. The first note a report has:
    on a shared host an algorithm can rank differently than on a cluster (fewer messages, or
    less CPU per step, win here; a slow link would decide there)."""
    if runs.empty:
        return []
    simulated = runs.get("simulated", pd.Series(False, index=runs.index)).fillna(False)
    emulated = runs.get("network", pd.Series(None, index=runs.index)).apply(
        lambda n: isinstance(n, dict))
    real = runs[~simulated.astype(bool) & ~emulated.astype(bool)]
    local = real[[_one_host(run) for _, run in real.iterrows()]]
    if local.empty:
        return []
    hosts: dict[tuple[str, int], int] = {}
    for _, run in local.iterrows():
        env = load_env(run["run_dir"])
        key = (str(env.get("hostname") or "this host"), int(env.get("cpu_count") or 0))
        world = run.get("world_size")
        world = int(world) if isinstance(world, int | float) and world == world else 0
        hosts[key] = max(hosts.get(key, 0), world)
    shares = "; ".join(f"up to {world} ranks on the {cores} cores of {host}" if cores
                       else f"up to {world} ranks on {host}"
                       for (host, cores), world in sorted(hosts.items()))
    hosts_column = pd.to_numeric(local.get("clock_hosts", pd.Series(dtype=float)),
                                 errors="coerce")
    bed = int((hosts_column > 1).sum())
    across = (f" {bed} of them spread over test-bed hosts, network namespaces of this machine "
              "joined by veth pairs: they share its cores, and their links are what the bed "
              "shaped, not a cluster's." if bed else "")
    return [f"Measured on one host, without a network model ({len(local)} real run(s): "
            f"{shares}): communication here is this host's loopback and its processes' share "
            "of its cores, not a cluster's links, and algorithms can rank differently on a "
            f"cluster.{across} For a cluster's costs, run the matrix with `--network PRESET` "
            "(prague, hop, ethernet-10g; docs/network.md) and emulated compute, or `bench sim`."]


def shared_gpu_note(runs: list[dict]) -> str | None:
    """The note for real runs whose ranks shared a GPU, or None: how many ranks shared which
    GPU, that point to point went through host memory and at what speed, and what a cluster
    would change. `runs`: each run's summary fields (`devices`, `backend`,
    `staged_p2p_mb_per_s`) with its env.json's `hostname` and `gpu`.

    A shared GPU ranks algorithms as this box does, not as a cluster would: the ranks' compute
    competes for one device, and every point-to-point message crosses to the host and back
    (gloo has no CUDA path for it), where collectives take gloo's own CUDA path. On a GPU
    box, point-to-point algorithms then look worse than their bytes explain (issue 44)."""
    shared: dict[tuple[str, str, str], int] = {}
    staged, speeds = 0, []
    for run in runs:
        devices = run.get("devices")
        if not isinstance(devices, list):
            continue
        counts: dict[str, int] = {}
        for device in devices:
            if isinstance(device, str) and device.startswith("cuda"):
                counts[device] = counts.get(device, 0) + 1
        sharing = {d: n for d, n in counts.items() if n > 1}
        if not sharing:
            continue
        host, gpu = str(run.get("hostname") or "this host"), str(run.get("gpu") or "GPU")
        for device, n in sharing.items():
            key = (host, device, gpu)
            shared[key] = max(shared.get(key, 0), n)
        if "point to point via host" in _text(run.get("backend")):
            staged += 1
        speed = run.get("staged_p2p_mb_per_s")
        if isinstance(speed, int | float) and speed == speed:
            speeds.append(float(speed))
    if not shared:
        return None
    where = "; ".join(f"up to {n} ranks on {device} ({gpu}) of {host}"
                      for (host, device, gpu), n in sorted(shared.items()))
    speed = (f", about {sorted(speeds)[len(speeds) // 2]:,.0f} MB/s for one model-sized "
             "message, measured at each run's start" if speeds else "")
    via_host = (f" Point-to-point messages went through host memory in {staged} run(s) (GPU "
                f"-> pinned host buffer -> gloo over loopback -> host -> GPU{speed}); "
                "collectives took gloo's own CUDA path." if staged else "")
    return (f"Ranks shared a GPU ({where}): their compute competed for one device.{via_host} "
            "With NCCL and a GPU per rank, messages go GPU to GPU, so point-to-point "
            "algorithms (parameter server, D-PSGD, AD-PSGD, Hop) would rank differently "
            "against All-Reduce than here. For a cluster's view, run the matrix with "
            "`--network PRESET` (prague, hop, ethernet-10g; docs/network.md), or `bench sim` "
            "with a `compute_preset`.")


def gpu_row(run, run_dir) -> dict:
    """What shared_gpu_note reads of one run: its summary's fields (a dict, or a report's
    DataFrame row) and its env.json's host and GPU."""
    env = load_env(run_dir)
    return {"devices": run.get("devices"), "backend": run.get("backend"),
            "staged_p2p_mb_per_s": run.get("staged_p2p_mb_per_s"),
            "hostname": env.get("hostname"), "gpu": env.get("gpu")}


def _one_host(run) -> bool:
    """Whether a real run's ranks all ran on one machine: what its ranks' done records say
    (the kernels, or the hostnames, they ran on), else what its launcher does (torchrun and
    mpirun without --hosts, like the local launcher, start every rank here; SLURM places
    them)."""
    for known in ("machines", "clock_hosts"):  # a test bed's hosts are one machine
        hosts = run.get(known)
        if isinstance(hosts, int | float) and hosts == hosts:
            return hosts <= 1
    launcher = run.get("launcher")
    kind = KINDS.get(launcher if isinstance(launcher, str) else DEFAULT_LAUNCHER)
    return (kind or KINDS[DEFAULT_LAUNCHER]).on_this_machine and not run.get("hosts")


def clock_notes(runs: pd.DataFrame) -> list[str]:
    """Runs whose ranks ran on several hosts: their clocks were aligned to rank 0's, how far
    apart they were, and how well that is known (comm/clock.py): the bound on how far any
    cross-rank time (a wait, a timeline, time to target) may still be off."""
    if runs.empty or "clock_hosts" not in runs:
        return []
    spread = runs[pd.to_numeric(runs["clock_hosts"], errors="coerce").fillna(1) > 1]
    if spread.empty:
        return []

    def most(column: str) -> float:
        values = pd.to_numeric(spread.get(column), errors="coerce").dropna()
        return float(values.max()) if len(values) else float("nan")

    return [f"Across hosts ({len(spread)} run(s), up to {int(most('clock_hosts'))} hosts): each "
            f"rank's clock was aligned to rank 0's, offsets up to {most('clock_offset_ms'):.3g} "
            f"ms, each known within {most('clock_error_ms'):.3g} ms, a drift of up to "
            f"{most('clock_drift_ms'):.3g} ms removed by the end (comm/clock.py): times "
            "compared across ranks (waits, timelines, time to target) may be off by the error "
            "bound, not by the offset."]


def gpu_notes(runs: pd.DataFrame) -> list[str]:
    """shared_gpu_note over a report's real runs."""
    if runs.empty or "devices" not in runs:
        return []
    note = shared_gpu_note([gpu_row(run, run["run_dir"]) for _, run in runs.iterrows()])
    return [note] if note else []


#: Real ranks' throughput on kernel-shaped links over the network model's, for the report's
#: caveat: figures digested from the results page's data (measured.toml says how).
SHAPED = tomllib.loads((Path(__file__).with_name("measured.toml")).read_text())["shaped_links"]


def point_to_point_note(runs: pd.DataFrame) -> list[str]:
    """What the network model leaves out of point-to-point messages, measured on kernel-shaped
    links: said where emulated runs moved point-to-point bytes (first come, first served), or
    simulated runs played a cluster's network (its transport's own caveat)."""
    simulated = runs.get("simulated", pd.Series(False, index=runs.index)).fillna(False)
    network = runs.get("network", pd.Series(None, index=runs.index))
    emulated = network.apply(lambda n: isinstance(n, dict)) & ~simulated.astype(bool)
    emulated_fair = emulated & network.apply(
        lambda n: isinstance(n, dict) and "fair transport" in n.get("description", ""))
    p2p = runs.get("p2p_mb_per_iteration", pd.Series(0.0, index=runs.index)).fillna(0.0)
    measured = sorted(set(runs[emulated & ~emulated_fair & (p2p > 0)]["algorithm"]))
    measured_fair = sorted(set(runs[emulated_fair & (p2p > 0)]["algorithm"]))
    clusters = runs.get("sim", pd.Series(None, index=runs.index)).apply(
        lambda s: s.get("network") if isinstance(s, dict) else None).dropna()
    fair = clusters.str.contains("fair transport", regex=False)
    notes = []
    if measured or (~fair).any():
        which = f" ({', '.join(measured)})" if measured else ""
        notes.append(
            f"Point-to-point messages{which} are modeled as leaving when sent and queuing first "
            "come, first served at each NIC; gloo over TCP moves a message only once its "
            "receive is posted, and concurrent flows share a link. On kernel-shaped links that "
            f"bound the step, real ranks measured {SHAPED['fcfs']} of this model's "
            "throughput (above it where its NIC queues convoy round an 8-host ring, below it "
            "elsewhere, most for a parameter server whose replies exceed a socket buffer): read "
            "point-to-point throughput here as off by up to half, either way "
            f"({SHAPED['page']}). [network] transport = \"fair\" models both.")
    if fair.any() or measured_fair:
        which = f" ({', '.join(measured_fair)} emulated)" if measured_fair else ""
        notes.append(
            f"Played with [network] transport = \"fair\"{which} (a message moves once its "
            "receive is posted; flows share links max-min fairly): on kernel-shaped links "
            "queued as a cluster's (a queue per peer out of each host, a FIFO into it) real "
            f"ranks measured {SHAPED['host_fair_fair']} of bench sim's throughput under it, "
            f"within 10% in {SHAPED['host_fair_fair_within_10_percent']} of "
            f"{SHAPED['host_fair_cells']} cells (transport = \"fcfs\": "
            f"{SHAPED['host_fair_fcfs_within_10_percent']}); it misses ps-sync (real ranks "
            "faster), Hop at 50 Mbit/s and prague-smart on 8 hosts. Under one FIFO a link "
            f"(tbf) real ranks measured {SHAPED['fair']}, within 10% in "
            f"{SHAPED['fair_within_10_percent']} of {SHAPED['cells']}, and "
            f"{SHAPED['emulated_fair']} of the emulator's (real ranks on one host), within 10% "
            f"in {SHAPED['emulated_fair_within_10_percent']} of {SHAPED['emulated_cells']}; "
            "Hop with a backup worker on messages beyond a socket buffer "
            f"{SHAPED['hop_large_messages']} (cause not found) ({SHAPED['page']}).")
    return notes


def network_notes(runs: pd.DataFrame) -> list[str]:
    """What an emulated network did to the numbers: which cluster, in which time, and which
    runs the host could not keep up with (their values are marked "(low fidelity)")."""
    if "network" not in runs:
        return []
    emulated = runs[runs["network"].apply(lambda n: isinstance(n, dict))]
    if emulated.empty:
        return []
    real = emulated[~emulated.get("simulated", pd.Series(False, index=emulated.index))
                    .fillna(False).astype(bool)]
    described = sorted({n["description"] for n in emulated["network"]})
    notes = [f"Emulated network ({len(emulated)} of {len(runs)} run(s); docs/network.md): "
             f"{'; '.join(described)}. Their times are cluster time (host time / dilation)."]
    if not real.empty and "fidelity" in real:
        low = real[real["fidelity"] != "high"]
        if not low.empty:
            names = ", ".join(f"{r['algorithm']} {r['slowdown']} w={r['workers']}"
                              for _, r in low.iterrows())
            notes.append(f"Low fidelity (the host fell behind the modeled network; raise "
                         f"dilation) in {len(low)} run(s): {names}.")
    return notes


def _text(value) -> str:
    """A summary field as text, "" where the run has none (NaN in the DataFrame)."""
    return value if isinstance(value, str) else ""


def _devices(devices) -> str:
    """Each rank's device, counted: "cuda:0 x2, cpu x1" (a parameter server's rank may differ)."""
    if not isinstance(devices, list):
        return ""
    counts: dict[str, int] = {}
    for device in devices:
        counts[str(device)] = counts.get(str(device), 0) + 1
    return ", ".join(f"{device} x{n}" for device, n in counts.items())


def metadata(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run: status, how it was measured (pacing, synthetic, emulated), where (env.json) and
    which code ran it (its code identity, core/identity.py: a plugin's version and source hash;
    empty for runs recorded before identities existed)."""
    from hetbench.core.identity import describe, recorded_identity

    rows = []
    for _, run in runs.iterrows():
        env = load_env(run["run_dir"])
        sha = env.get("git_sha") or ""
        code = run.get("code")
        rows.append({
            "run_id": run["run_id"], "status": run["status"],
            "compute": run.get("compute", ""), "synthetic": run.get("synthetic", ""),
            "simulated": run.get("simulated", False),
            "pace_ms": run.get("pace_ms", ""),
            # Which model the accuracy columns score (Algorithm.evaluated_model).
            "evaluated_model": _text(run.get("evaluated_model")),
            "code": describe(recorded_identity({"code": code} if isinstance(code, dict)
                                               else None, env)),
            "git": f"{sha[:10]}{' (dirty)' if env.get('git_dirty') else ''}",
            "python": env.get("python", ""), "torch": env.get("torch", ""),
            "host": env.get("hostname", ""), "cpus": env.get("cpu_count", ""),
            "gpu": env.get("gpu") or "none", "platform": env.get("platform", ""),
            "backend": _text(run.get("backend")), "devices": _devices(run.get("devices")),
        })
    return pd.DataFrame(rows)


def timing_notes(runs: pd.DataFrame) -> list[str]:
    """Learned simulations with another workload's costs ([timing]): which numbers are whose,
    so nobody takes a proxy's accuracy for the timing workload's."""
    if "timing" not in runs:
        return []
    pairs: dict[tuple[str, str], dict] = {}
    for workload, timing in zip(runs["workload"], runs["timing"], strict=True):
        if isinstance(timing, dict):
            pairs.setdefault((workload, timing["workload"]), timing)
    notes = []
    for (workload, timing_workload), timing in sorted(pairs.items()):
        preset = timing.get("compute_preset")
        notes.append(
            f"Timing of another workload: the learned simulations of {workload} played "
            f"{timing_workload}'s costs (batch {timing['batch_size']}, compute "
            f"{timing['compute_ms']:.2f} ms" + (f" from compute_preset {preset}" if preset else "")
            + f", {timing['model_bytes'] / 1e6:.1f} MB messages): their throughput (in "
            f"{timing_workload}'s samples) and seconds are a {timing_workload} job's on the "
            f"simulated machines; their accuracy, loss, iterations and consensus are those "
            f"of {workload}, not a {timing_workload}'s.")
    return notes


def baseline_notes(runs, baseline: str) -> list[str]:
    """A warning when no run has the baseline's name but some are variants of it (a matrix that
    sweeps one of its options, or runs it on two networks): every ratio column is then empty,
    and the reader must pick the variant to compare against."""
    if runs.empty or "algorithm" not in runs or (runs["algorithm"] == baseline).any():
        return []
    variants = sorted(a for a in runs["algorithm"].unique() if base_name(a) == baseline)
    if not variants:
        return []
    return [f"No run is named {baseline}, so no ratio to it is shown: its runs here are "
            f"variants ({', '.join(variants)}); pass one as --baseline, e.g. "
            f"`--baseline \"{variants[0]}\"`."]
