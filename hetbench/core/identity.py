"""A run's code identity: which code implemented its algorithm and workload.

The run id hashes the config alone (core/config.py), so that stored results keep their ids; the
identity is recorded beside it (summary.json's and env.json's `code`), and a finished run whose
recorded identity is not the current one is run again (harness/runner.py; `bench sim` alike).

Each component's identity is one string:
- a built-in: hetbench's version, `hetbench 0.1.0`;
- a plugin: its distribution's name and version where it has one, and a hash of its source (its
  module's file; for a package, every .py file under it), `my-plugin 0.2, source 1a2b3c4d5e6f`
  or `source 1a2b3c4d5e6f`: a plugin's version alone does not change while its author edits it.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetbench.core.registry import ALGORITHMS, WORKLOADS, Registry

if TYPE_CHECKING:
    from hetbench.core.config import RunConfig

#: The summary.json / env.json key.
KEY = "code"


def code_identity(config: RunConfig) -> dict[str, str]:
    """{"algorithm": ..., "workload": ...} (and "timing_workload" for a [timing] table's other
    workload) of `config`, as the current process has them loaded."""
    identity = {"algorithm": component_identity(ALGORITHMS, config.algorithm),
                "workload": component_identity(WORKLOADS, config.workload)}
    timing = config.timing.get("workload") if config.timing else None
    if timing and timing != config.workload:
        identity["timing_workload"] = component_identity(WORKLOADS, timing)
    return identity


def code_record(config: RunConfig) -> dict[str, dict[str, str]]:
    """{"code": code_identity(config)}: what a summary (real or simulated) adds to record it."""
    return {KEY: code_identity(config)}


def component_identity(registry: Registry, name: str) -> str:
    cls = registry.get(name)
    module = cls.__module__
    if registry.is_builtin(name) or module.split(".")[0] == "hetbench":
        return f"hetbench {hetbench_version()}"
    parts = []
    dist = registry.distribution(name) or _distribution_of(module.split(".")[0])
    if dist is not None:
        parts.append(f"{dist[0]} {dist[1]}")
    digest = source_digest(module)
    parts.append(f"source {digest}" if digest else "source unknown")
    return ", ".join(parts)


@functools.cache
def hetbench_version() -> str:
    try:
        return version("hetbench")
    except PackageNotFoundError:  # a source tree run without installing it
        return "unknown"


@functools.cache
def _distribution_of(top_level: str) -> tuple[str, str] | None:
    names = packages_distributions().get(top_level) or []
    for name in names:
        try:
            return name, version(name)
        except PackageNotFoundError:
            continue
    return None


@functools.cache
def source_digest(module_name: str) -> str | None:
    """12 hex digits of the SHA-256 of the module's source: of every .py file (by relative path
    and content) of its top-level package when it is in one, else of its own file; None when
    there is no source to read."""
    top = sys.modules.get(module_name.split(".")[0])
    module = sys.modules.get(module_name)
    roots = [Path(p) for p in getattr(top, "__path__", None) or []]
    if roots:
        files = sorted((root, path) for root in roots for path in root.rglob("*.py")
                       if "__pycache__" not in path.parts)
    elif module is not None and getattr(module, "__file__", None):
        path = Path(module.__file__)
        files = [(path.parent, path)]
    else:
        return None
    digest = hashlib.sha256()
    try:
        for root, path in files:
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    except OSError:
        return None
    return digest.hexdigest()[:12] if files else None


def recorded_identity(summary: dict[str, Any] | None,
                      env: dict[str, Any] | None) -> dict[str, str] | None:
    """The identity a run recorded (its summary's, else its env.json's), or None for a run
    recorded before identities existed."""
    for record in (summary, env):
        if isinstance(record, dict) and isinstance(record.get(KEY), dict):
            return record[KEY]
    return None


def code_change(recorded: dict[str, str] | None, current: dict[str, str]) -> str | None:
    """Why a finished run's code is not the current one (one phrase), or None when it is."""
    if recorded is None:
        # Before identities existed nothing recorded which code ran. A built-in's code is the
        # checkout's, which its git_sha already tracks for the reader, so its results stand; a
        # plugin's source may have been edited since with nothing on record to say it was not,
        # and a rerun costs one run where trusting it could cost a wrong verdict.
        plugins = [k for k, v in current.items() if not v.startswith("hetbench ")]
        if not plugins:
            return None
        return (f"it was recorded without a code identity, so its {' and '.join(plugins)}'s "
                f"plugin code cannot be told unchanged (now {describe(current)})")
    changed = [f"{key} {recorded.get(key, 'none')} -> {current.get(key, 'none')}"
               for key in sorted(set(recorded) | set(current))
               if recorded.get(key) != current.get(key)]
    if not changed:
        return None
    return f"its code changed ({'; '.join(changed)})"


def describe(identity: dict[str, str] | None) -> str:
    """One cell's text: the identity shared by every component once, else each named."""
    if not identity:
        return ""
    values = list(dict.fromkeys(identity.values()))
    if len(values) == 1:
        return values[0]
    return "; ".join(f"{key}: {value}" for key, value in identity.items())
