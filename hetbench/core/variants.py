"""Names that tell runs of one algorithm apart when a matrix sweeps its options.

A sweep (`backup_workers = [0, 1, 2]` in `[algorithm.hop]`) or a per-algorithm workload option
(`[algorithm.allreduce.workload] lr = 0.05`) makes several runs of one algorithm on one workload
that differ only in options. Reports, run labels and plots must keep them apart, and say what
differs: such a run is named `hop[backup_workers=2]`, listing each option that takes more than
one value among that algorithm's runs on that workload and is not at its default in this run.
The run whose varied options are all at their defaults keeps the bare name, so `allreduce`
stays the baseline every report compares against; options that do not vary (set once in the
matrix) stay out of every name, as before sweeps existed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

#: One run, as far as its name is concerned.
RunOptions = tuple[str, str, Mapping[str, Any], Mapping[str, Any]]


def variant_names(runs: Iterable[RunOptions]) -> list[str]:
    """For each (algorithm, workload, algorithm_options, workload_options), in order: its name
    among the others (see the module docstring)."""
    runs = list(runs)
    values: dict[tuple[str, str], dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for algorithm, workload, algo_opts, load_opts in runs:
        for key, value in _options(algo_opts, load_opts).items():
            values[(algorithm, workload)][key].add(_hashable(value))
    names = []
    for algorithm, workload, algo_opts, load_opts in runs:
        varied = values[(algorithm, workload)]
        if not any(len(seen) > 1 for seen in varied.values()):
            names.append(algorithm)  # nothing varies: no defaults needed (no algorithm import)
            continue
        defaults = _defaults(algorithm, workload)
        shown = [f"{key}={_text(value)}"
                 for key, value in sorted(_options(algo_opts, load_opts).items())
                 if len(varied[key]) > 1 and not (key in defaults and defaults[key] == value)]
        names.append(f"{algorithm}[{','.join(shown)}]" if shown else algorithm)
    return names


def with_network(load_opts: Mapping[str, Any] | None,
                 network: Mapping[str, Any] | None,
                 timing: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Workload options plus the run's network model as one more option, so that runs on
    different emulated networks (or on none) are named apart and never averaged together:
    `allreduce[network=prague/x8]`; a run without one is `network=none` (the default: the bare
    name). Likewise a learned simulation's timing workload ([timing]): `timing=resnet50/64/h200`
    beside `timing=own`."""
    return {**(load_opts or {}), "network": network_label(network),
            "timing": timing_label(timing)}


def timing_label(timing: Mapping[str, Any] | None) -> str:
    """`own` (the workload's own costs), or the timing workload, its batch and its compute
    preset: `resnet50/64/h200`."""
    if not timing:
        return "own"
    preset = timing.get("compute_preset") or ""
    return "/".join(str(part) for part in (timing.get("workload"), timing.get("batch_size"),
                                           preset) if part)


def network_label(network: Mapping[str, Any] | None) -> str:
    """`none`, `prague/x8` (a preset as it is, dilation 8), `prague/tree/x8` (its collectives
    as trees), `prague/fair/x8` (its point-to-point messages as fair flows), or
    `custom-1a2b/x8` (own values, told apart by a digest of the links)."""
    if not network:
        return "none"
    from hetbench.network.model import resolve_network

    links = {k: v for k, v in network.items()
             if k not in ("preset", "dilation", "max_lateness", "collective", "transport")}
    preset = network.get("preset", "")
    name = preset or "custom"
    if not preset or any(resolve_network({"preset": preset})[k] != v for k, v in links.items()):
        digest = hashlib.sha1(json.dumps(links, sort_keys=True).encode()).hexdigest()[:4]
        name = f"{name}-{digest}"
    collective = network.get("collective", "ring")
    if collective != "ring":
        name = f"{name}/{collective}"
    transport = network.get("transport", "fcfs")
    if transport != "fcfs":
        name = f"{name}/{transport}"
    return f"{name}/x{network.get('dilation', 1.0):g}"


def base_name(name: str) -> str:
    """The algorithm of a variant name: `hop[backup_workers=2]` -> `hop`."""
    return name.split("[", 1)[0]


def _options(algo_opts: Mapping[str, Any], load_opts: Mapping[str, Any]) -> dict[str, Any]:
    # An algorithm option and a workload option of one name would be ambiguous in a label;
    # none exists, and the workload's is prefixed if a plugin ever adds one.
    merged = dict(algo_opts or {})
    for key, value in (load_opts or {}).items():
        merged[f"workload.{key}" if key in merged else key] = value
    return merged


def _defaults(algorithm: str, workload: str) -> dict[str, Any]:
    """Every option's default of the algorithm and the workload ({} for a component that is not
    registered here, e.g. a plugin a report's reader does not have: its options all show)."""
    from hetbench.core.registry import ALGORITHMS, WORKLOADS

    found: list[dict[str, Any]] = []
    for registry, name in ((ALGORITHMS, algorithm), (WORKLOADS, workload)):
        try:
            config_cls = registry.get(name).Config
        except Exception:  # a plugin this reader cannot import: no defaults, show all
            found.append({})
            continue
        found.append({f.name: f.default for f in dataclasses.fields(config_cls)
                      if f.default is not dataclasses.MISSING})
    found[1]["network"] = "none"  # with_network's options: no network model is the default,
    found[1]["timing"] = "own"  # and the workload's own costs
    return _options(*found)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
