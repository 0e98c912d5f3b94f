"""Name -> class registries, imported lazily.

Built-in entries name a module path so `bench list` and validation import only what they need and
a missing optional dependency (horovod, say) breaks only the entry that needs it. Third-party
plugins register through the entry-point groups `hetbench.algorithms` and `hetbench.workloads`
(value "module:Class") of installed packages, or are loaded for one command from a file,
directory or module (`--plugin PATH_OR_MODULE` / HETBENCH_PLUGINS: core/plugins.py, which calls
`add_plugin`).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from hetbench.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_point_group: str, builtin: dict[str, str]):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._targets: dict[str, str | type[T]] = dict(builtin)
        #: The built-ins in the order given: the order tables and legends show them in.
        self.builtin_order: tuple[str, ...] = tuple(builtin)
        self._plugins_loaded = False
        #: Plugins loaded for this command (--plugin / HETBENCH_PLUGINS): name -> its spec.
        self._loaded_from: dict[str, str] = {}
        #: Plugins' distributions where known: name -> (distribution name, version).
        self._distributions: dict[str, tuple[str, str]] = {}

    def add(self, name: str, target: str | type[T]) -> None:
        """Register `name` as a class or a "module:Class" path."""
        self._targets[name] = target

    def add_plugin(self, name: str, target: str | type[T], spec: str,
                   distribution: tuple[str, str] | None = None) -> None:
        """Register a plugin loaded from `spec` (core/plugins.py): it takes the place of an
        installed entry point of the same name (the copy being worked on wins over a stale
        install); UserError when `name` is built in or another spec registered it."""
        if name in self.builtin_order:
            raise UserError(f"{self.kind} {name!r} is a built-in name; give the class "
                            "another `name`")
        other = self._loaded_from.get(name)
        if other is not None and self._targets.get(name) is not target:
            raise UserError(f"{self.kind} {name!r} is registered by {other} too; give one of "
                            "them another `name`")
        self._targets[name] = target
        self._loaded_from[name] = spec
        if distribution is not None:
            self._distributions[name] = distribution
        else:
            self._distributions.pop(name, None)

    def is_builtin(self, name: str) -> bool:
        """Whether `name` is hetbench's own (not a plugin's)."""
        return name in self.builtin_order

    def distribution(self, name: str) -> tuple[str, str] | None:
        """(distribution name, version) of the package that registered plugin `name` through
        its entry point, when one did."""
        self._load_plugins()
        return self._distributions.get(name)

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=self.entry_point_group):
            if ep.name in self._targets:
                continue  # a built-in, or a plugin loaded for this command
            self._targets[ep.name] = ep.value
            if ep.dist is not None:
                self._distributions[ep.name] = (ep.dist.metadata["Name"], ep.dist.version)

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._targets)

    def get(self, name: str) -> type[T]:
        """The class registered as `name`; UserError if unknown or if its module fails to import."""
        self._load_plugins()
        if name not in self._targets:
            raise UserError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())} (see `bench "
                f"list`); plugins load from the entry points `{self.entry_point_group}` of "
                "installed packages, or from --plugin PATH_OR_MODULE / HETBENCH_PLUGINS (a .py "
                "file, a directory or a module name)"
            )
        target = self._targets[name]
        if isinstance(target, str):
            module_name, _, attr = target.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise UserError(f"{self.kind} {name!r} is unavailable: {exc}") from exc
            target = getattr(module, attr)
            self._targets[name] = target
        return target


# Built-ins are named by module path, so the contracts need not import any algorithm or
# workload (they sit above this layer) and each is imported on first use.
# In the papers' order (Prague's and Hop's tables), then the other baselines by name: tables
# and plot legends show them so, plugins after them by name (reports/tables.py).
ALGORITHMS: Registry = Registry("algorithm", "hetbench.algorithms", {
    "allreduce": "hetbench.algorithms.allreduce:AllReduce",
    "ps-sync": "hetbench.algorithms.ps:ParameterServerSync",
    "ps-async": "hetbench.algorithms.ps:ParameterServerAsync",
    "dpsgd": "hetbench.algorithms.dpsgd:DPSGD",
    "adpsgd": "hetbench.algorithms.adpsgd:ADPSGD",
    "hop": "hetbench.algorithms.hop:Hop",
    "prague-static": "hetbench.algorithms.prague.static:PragueStatic",
    "prague-smart": "hetbench.algorithms.prague.smart:PragueSmart",
    "prague-random": "hetbench.algorithms.prague.random:PragueRandom",
    "allreduce-backup": "hetbench.algorithms.allreduce_backup:AllReduceBackup",
    "diloco": "hetbench.algorithms.diloco:DiLoCo",
    "dropcompute": "hetbench.algorithms.dropcompute:DropCompute",
    "async-diloco": "hetbench.algorithms.async_diloco:AsyncDiLoCo",
    "batch-balance": "hetbench.algorithms.batch_balance:BatchBalance",
    # The template to copy when adding an algorithm (a real one: local SGD).
    "local-sgd": "hetbench.algorithms.template:LocalSGD",
    "osgp": "hetbench.algorithms.sgp:OSGP",
    "sgp": "hetbench.algorithms.sgp:SGP",
})

WORKLOADS: Registry = Registry("workload", "hetbench.workloads", {
    "svm": "hetbench.workloads.svm:LinearSVM",
    "mlp-digits": "hetbench.workloads.mlp_digits:MLPDigits",
    "mlp-clusters": "hetbench.workloads.mlp_clusters:MLPClusters",
    "cnn-cifar10": "hetbench.workloads.cnn_cifar10:CNNCifar10",
    "resnet18": "hetbench.workloads.resnet:ResNet18",
    "resnet50": "hetbench.workloads.resnet:ResNet50",
    "resnet200": "hetbench.workloads.resnet:ResNet200",
    "vgg16": "hetbench.workloads.vgg16:VGG16",
    "transformer": "hetbench.workloads.transformer:Transformer",
})
