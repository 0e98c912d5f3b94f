"""Matrix expansion: a TOML file and/or CLI flags -> the list of RunConfigs to run.

A matrix file holds lists for the swept axes and scalars for the rest:

    name = "quick"                      # results go to results/<name>/ unless --out says
    algorithms = ["allreduce", "ps-sync"]
    workloads = ["mlp-digits"]
    workers = [4]
    slowdown = ["none", "prob:5"]
    seeds = [1]
    iterations = 200
    pace_ms = 0
    [algorithm.hop]                     # options of one algorithm
    backup_workers = [0, 1, 2]          # a list sweeps: one run per value
    [algorithm.allreduce.workload]      # workload options for one algorithm's runs only
    lr = 0.05
    [workload.mlp-digits]               # options of one workload
    batch_size = 32

Flags given on the command line replace the file's value of the same key. A list in an option
table expands into runs like the axes above (lists in several options: every combination);
runs that differ in options are told apart by hetbench.core.variants' names.
"""

from __future__ import annotations

import itertools
import os
import tomllib
from pathlib import Path
from typing import Any

from hetbench.core.config import RunConfig
from hetbench.core.launchers import KINDS
from hetbench.errors import UserError
from hetbench.network.model import resolve_network

AXES = {"algorithms": str, "workloads": str, "workers": int, "slowdown": str, "seeds": int}
SCALARS = {
    "iterations": int, "seconds": float, "pace_ms": float, "warmup_iterations": int,
    "comm_timeout_s": float, "eval_interval_s": float, "device": str, "save_models": bool,
    "launcher": str, "fault": str, "bind_host": str, "learn": bool, "hosts": str,
}
TABLES = ("algorithm", "workload")
DEFAULTS: dict[str, Any] = {"slowdown": ["none"], "seeds": [1]}


def load_matrix_file(path: Path) -> dict[str, Any]:
    """Parse a matrix TOML file into a plain dict, with one-line errors for what is wrong."""
    if not path.is_file():
        raise UserError(f"matrix file {path} " + ("is a directory, not a matrix file"
                                                  if path.is_dir() else "does not exist"))
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"matrix file {path} is not valid TOML: {exc}") from None
    data.setdefault("name", path.stem)
    return data


def expand(spec: dict[str, Any]) -> list[RunConfig]:
    """Every combination of the axes as a validated RunConfig (first error stops expansion)."""
    spec = {**DEFAULTS, **spec}
    # [tune] is bench tune's (hetbench.harness.tune), [slurm] a launcher's options
    # (core/launchers.py's options_table): neither is part of a run.
    # [network] is the emulated cluster's (hetbench.network.model), the same for every run.
    # [timing] is a learned simulation's costs from another workload (RunConfig.timing).
    launcher_tables = {k.options_table for k in KINDS.values() if k.options_table}
    known = set(AXES) | set(SCALARS) | set(TABLES) | launcher_tables | {
        "name", "description", "target", "tune", "network", "timing"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise UserError(
            f"matrix: unknown key(s) {', '.join(unknown)}; keys are: {', '.join(sorted(known))}"
        )
    for axis in ("algorithms", "workloads", "workers"):
        if axis not in spec:
            raise UserError(f"matrix: no {axis} given; set `{axis} = [...]` or pass --{axis}")
    axes = {axis: _as_list(spec[axis], kind, axis) for axis, kind in AXES.items()}
    scalars = {}
    for key, kind in SCALARS.items():
        if key in spec:
            scalars[key] = _check_scalar(spec[key], kind, key)
    if "seconds" in spec and "iterations" not in spec:
        scalars["iterations"] = None
    tables = {}
    for table in TABLES:
        value = spec.get(table, {})
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise UserError(f"matrix: [{table}.<name>] tables must hold options, got {value!r}")
        tables[table] = value
    for name in tables["algorithm"]:
        if name not in axes["algorithms"]:
            raise UserError(f"matrix: [algorithm.{name}] names an algorithm not in `algorithms`")
    for name in tables["workload"]:
        if name not in axes["workloads"]:
            raise UserError(f"matrix: [workload.{name}] names a workload not in `workloads`")

    network = resolve_network(spec.get("network"))
    timing = spec.get("timing", {})
    if not isinstance(timing, dict):
        raise UserError(f"matrix: [timing] must be a table (workload = \"NAME\" and its "
                        f"options), got {timing!r}")
    configs = []
    seen = set()
    for algorithm, workload, workers, slowdown, seed in itertools.product(*axes.values()):
        algo_table = dict(tables["algorithm"].get(algorithm, {}))
        own_workload = algo_table.pop("workload", {})
        if not isinstance(own_workload, dict):
            raise UserError(f"matrix: [algorithm.{algorithm}.workload] must be a table of "
                            f"workload options, got {own_workload!r}")
        load_table = {**tables["workload"].get(workload, {}), **own_workload}
        for algo_opts, load_opts in itertools.product(
                sweep(algo_table, f"[algorithm.{algorithm}]"),
                sweep(load_table, f"the workload options of {algorithm} on {workload}")):
            config = RunConfig(
                algorithm=algorithm, workload=workload, workers=workers, slowdown=slowdown,
                seed=seed, algorithm_options=algo_opts, workload_options=load_opts,
                matrix=str(spec.get("name", "adhoc")), target=_target_for(spec, workload),
                network=network, timing=timing, **scalars,
            )
            if config.run_id not in seen:
                seen.add(config.run_id)
                configs.append(config)
    return configs


def sweep(options: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Every combination of an option table whose lists are swept: `{"a": [1, 2], "b": 3}`
    -> `[{"a": 1, "b": 3}, {"a": 2, "b": 3}]` (no option takes a list as its one value)."""
    swept = {key: value for key, value in options.items() if isinstance(value, list)}
    for key, value in swept.items():
        if not value:
            raise UserError(f"matrix: {where} {key} is an empty list; give one value or several")
    combos = itertools.product(*swept.values())
    return [{**options, **dict(zip(swept, combo, strict=True))} for combo in combos]


def _target_for(spec: dict[str, Any], workload: str) -> str:
    """The matrix's `target` for one workload: a string for all, or a table of workload = spec
    ("*" for the rest); '' if none."""
    value = spec.get("target")
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return value.get(workload, value.get("*", ""))
    raise UserError(f"matrix: target must be 'accuracy:V' / 'loss:V' or a table of workload = "
                    f"spec, got {value!r}")


def _as_list(value: Any, kind: type, key: str) -> list:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise UserError(f"matrix: {key} is empty")
    return [_check_scalar(v, kind, key) for v in values]


def _check_scalar(value: Any, kind: type, key: str) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool):
        raise UserError(f"matrix: {key} must be an integer, got {value!r}")
    if not isinstance(value, kind):
        raise UserError(f"matrix: {key} must be {kind.__name__}, got {value!r}")
    return value


def split_list(text: str | None, kind: type, flag: str) -> list | None:
    """A comma-separated flag value as a list of `kind` (None if the flag was not given)."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",") if item.strip()]
    if kind is str and flag == "--slowdown":
        items = _rejoin_slowdowns(items)
    try:
        return [kind(item) for item in items]
    except ValueError:
        raise UserError(
            f"{flag}: expected comma-separated {kind.__name__}s, got {text!r}") from None


def _rejoin_slowdowns(items: list[str]) -> list[str]:
    """`det:5@0,3` contains a comma: glue bare integers back onto the det spec before them."""
    out: list[str] = []
    for item in items:
        if item.isdigit() and out and out[-1].startswith("det:"):
            out[-1] += "," + item
        else:
            out.append(item)
    return out


def from_file_and_flags(matrix_file: Path | None, *, algorithms: str | None = None,
                        workloads: str | None = None, workers: str | None = None,
                        slowdown: str | None = None, iterations: int | None = None,
                        seconds: float | None = None, seeds: str | None = None,
                        pace_ms: float | None = None, launcher: str | None = None,
                        network: str | None = None, dilation: float | None = None,
                        target: str | None = None, learn: bool = False,
                        hosts: str | None = None) -> tuple[dict[str, Any], list[RunConfig]]:
    """The matrix of a file (optional) with command-line flags over it: (spec, RunConfigs).
    `network` names a preset (or "none": no network model), `dilation` sets the network's."""
    spec = load_matrix_file(matrix_file) if matrix_file else {"name": "adhoc"}
    if network == "none":
        spec.pop("network", None)
    elif network is not None:  # the preset's values, under nothing the file set
        spec["network"] = {"preset": network}
    if dilation is not None:
        if not spec.get("network"):
            raise UserError("--dilation stretches a network model's time: give --network "
                            "PRESET or a [network] table too")
        spec["network"] = {**spec["network"], "dilation": dilation}
    flags = {
        "algorithms": split_list(algorithms, str, "--algorithms"),
        "workloads": split_list(workloads, str, "--workloads"),
        "workers": split_list(workers, int, "--workers"),
        "slowdown": split_list(slowdown, str, "--slowdown"),
        "seeds": parse_seeds(seeds),
        "iterations": iterations,
        "seconds": seconds,
        "pace_ms": pace_ms,
        "launcher": launcher,
        "target": target,
        "learn": True if learn else None,
        "hosts": hosts,
    }
    if seconds is not None and iterations is None:
        spec.pop("iterations", None)
    spec.update({k: v for k, v in flags.items() if v is not None})
    if spec.get("hosts"):
        # Ranks on other hosts reach the run's services (the Group Generator) only on an
        # address of this machine's that they route to.
        spec.setdefault("bind_host", "0.0.0.0")
    # A flag that narrows the file's algorithms or workloads leaves their option tables unused,
    # not wrong: `bench run matrices/quick.toml --algorithms allreduce` runs.
    for table, axis in (("algorithm", "algorithms"), ("workload", "workloads")):
        if flags[axis] is not None and isinstance(spec.get(table), dict):
            spec[table] = {k: v for k, v in spec[table].items() if k in flags[axis]}
    return spec, expand(spec)


def parse_seeds(text: str | None) -> list[int] | None:
    """`--seeds 3` means three seeds, 1..3; `--seeds 7,` or `1,5` names seeds exactly."""
    seeds = split_list(text, int, "--seeds")
    if seeds is not None and len(seeds) == 1 and "," not in text and seeds[0] > 1:
        return list(range(1, seeds[0] + 1))
    return seeds


def check_writable(out_dir: Path) -> None:
    """UserError unless `out_dir` exists writable or can be created."""
    probe_dir = out_dir
    while not probe_dir.exists():
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir() or not os.access(probe_dir, os.W_OK):
        raise UserError(f"output directory {out_dir} is not writable; pass --out to a writable one")
