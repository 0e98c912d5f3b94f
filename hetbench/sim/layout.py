"""What a workload's messages weigh in the simulator: the real model's element count and its
All-Reduce buckets, built once per workload and kept in a cache across commands."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hetbench.core.config import RunConfig

#: Bytes per model element (float32, as every built-in workload trains in).
ELEMENT_BYTES = 4


@dataclass(frozen=True)
class Layout:
    """What a workload's messages weigh: the model's element count and its all-reduce buckets."""

    numel: int
    bucket_bytes: tuple[int, ...]

    @property
    def model_bytes(self) -> int:
        return self.numel * ELEMENT_BYTES


def layout(config: RunConfig) -> Layout:
    """The real model's size and All-Reduce buckets (the model is built once per workload)."""
    bucket_mb = config.algorithm_options.get("bucket_mb", 25.0)
    return _layout(config.workload, json.dumps(config.workload_options, sort_keys=True),
                   config.seed, float(bucket_mb))


@lru_cache(maxsize=32)
def _layout(workload: str, options_json: str, seed: int, bucket_mb: float) -> Layout:
    from hetbench.core.options import build_config
    from hetbench.core.registry import WORKLOADS

    cls = WORKLOADS.get(workload)
    key = _layout_key(cls, workload, options_json, seed, bucket_mb)
    cached = LayoutCache().get(key)
    if cached is not None:
        return cached
    from hetbench.core.tensors import buckets, params_of

    model = cls(build_config(cls.Config, json.loads(options_json), workload), seed).build_model()
    params = params_of(model)
    groups = buckets(params, int(bucket_mb * 2**20))
    sizes = tuple(sum(p.numel() for p in group) * ELEMENT_BYTES for group in groups if group)
    built = Layout(sum(p.numel() for p in params), sizes)
    LayoutCache().put(key, built)
    return built


def _layout_key(cls, workload: str, options_json: str, seed: int, bucket_mb: float) -> str:
    """What a layout depends on: the workload and its options, the source of the module that
    builds its model and of the bucketing, and the torch/torchvision versions."""
    import hashlib
    import inspect
    from importlib import metadata

    from hetbench.core import tensors

    digest = hashlib.sha256()
    for module in (inspect.getmodule(cls), tensors):
        digest.update(Path(inspect.getfile(module)).read_bytes())
    for package in ("torch", "torchvision"):
        try:
            digest.update(metadata.version(package).encode())
        except metadata.PackageNotFoundError:
            digest.update(b"-")
    digest.update(json.dumps([workload, options_json, seed, bucket_mb]).encode())
    return digest.hexdigest()


class LayoutCache:
    """Layouts built before, in HETBENCH_CACHE_DIR (else ~/.cache/hetbench)/layouts.json.

    Building a model for its message sizes means importing torchvision and allocating the
    model, a large part of a `bench sim` command's start-up, for numbers that only change
    with the code or the versions in the key. A cache that cannot be read or written is
    skipped (the layout is built); the newest MAX_ENTRIES are kept.
    """

    MAX_ENTRIES = 256

    def __init__(self):
        import os

        root = os.environ.get("HETBENCH_CACHE_DIR") or Path.home() / ".cache" / "hetbench"
        self.path = Path(root) / "layouts.json"

    def _entries(self) -> dict:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def get(self, key: str) -> Layout | None:
        entry = self._entries().get(key)
        try:
            return Layout(int(entry["numel"]), tuple(int(b) for b in entry["bucket_bytes"]))
        except (TypeError, KeyError, ValueError):
            return None

    def put(self, key: str, built: Layout) -> None:
        from hetbench.core.store import write_json_atomic

        entries = self._entries()
        entries.pop(key, None)
        entries[key] = {"numel": built.numel, "bucket_bytes": list(built.bucket_bytes)}
        entries = dict(list(entries.items())[-self.MAX_ENTRIES:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, entries)
        except OSError:
            pass  # a read-only home: build the layout each time
