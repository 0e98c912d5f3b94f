"""What a reader must know before trusting a report's numbers, and where each run was measured:
the notes at the top of every report (unreadable or running runs, one host, an emulated network)
and the run-metadata table at its end."""

from __future__ import annotations

import pandas as pd

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
    local = real[real.get("launcher", pd.Series("local", index=real.index)).fillna("local")
                 == "local"]
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
    return [f"Measured on one host, without a network model ({len(local)} real run(s): "
            f"{shares}): communication here is this host's loopback and its processes' share "
            "of its cores, not a cluster's links, and algorithms can rank differently on a "
            "cluster. For a cluster's costs, run the matrix with `--network PRESET` (prague, "
            "hop, ethernet-10g; docs/network.md) and emulated compute, or `bench sim`."]


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
    """Per run: status, how it was measured (pacing, synthetic, emulated) and where (env.json)."""
    rows = []
    for _, run in runs.iterrows():
        env = load_env(run["run_dir"])
        sha = env.get("git_sha") or ""
        rows.append({
            "run_id": run["run_id"], "status": run["status"],
            "compute": run.get("compute", ""), "synthetic": run.get("synthetic", ""),
            "simulated": run.get("simulated", False),
            "pace_ms": run.get("pace_ms", ""),
            "git": f"{sha[:10]}{' (dirty)' if env.get('git_dirty') else ''}",
            "python": env.get("python", ""), "torch": env.get("torch", ""),
            "host": env.get("hostname", ""), "cpus": env.get("cpu_count", ""),
            "gpu": env.get("gpu") or "none", "platform": env.get("platform", ""),
            "backend": _text(run.get("backend")), "devices": _devices(run.get("devices")),
        })
    return pd.DataFrame(rows)
