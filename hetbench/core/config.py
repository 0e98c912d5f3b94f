"""RunConfig: one fully resolved cell of a matrix, validated before any process starts."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from hetbench.core.launchers import DEFAULT_LAUNCHER, KINDS, launcher_kind
from hetbench.core.options import added_later_defaults, build_config
from hetbench.errors import UserError

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that determines a run; its hash is the run id, so equal configs resume."""

    algorithm: str
    workload: str
    workers: int
    slowdown: str = "none"
    seed: int = 1
    #: Iteration budget per worker; the run stops at whichever budget ends first.
    iterations: int | None = 200
    #: Wall-clock budget in seconds after the common start.
    seconds: float | None = None
    #: Floor on each iteration's compute time (ms), so workers sharing cores behave alike.
    pace_ms: float = 0.0
    #: Iterations at the start of each worker excluded from throughput.
    warmup_iterations: int = 5
    #: Options of the algorithm / workload, defaults filled in once resolved.
    algorithm_options: dict[str, Any] = field(default_factory=dict)
    workload_options: dict[str, Any] = field(default_factory=dict)
    #: Who starts the ranks: local subprocesses, torchrun (c10d rendezvous, multi-node), mpirun,
    #: or a SLURM job per run (submitit).
    launcher: str = DEFAULT_LAUNCHER  # a name of core/launchers.py
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: Bound on every blocking communication; a dead or hung peer fails the run after this long.
    #: Cluster seconds under a network model: the host waits comm_timeout_s x dilation
    #: (host_timeout_s), since every legitimate wait (a straggler's step) stretches with it.
    comm_timeout_s: float = 30.0
    #: Seconds between model snapshots evaluated after training (convergence curves).
    eval_interval_s: float = 1.0
    #: Write each worker's final flat parameters (model.rank<r>.npy) for checking.
    save_models: bool = False
    #: Injected fault for reliability tests: crash@R:I, kill@R:I or hang@R:I ('' = none).
    fault: str = ""
    #: Address the rendezvous store listens on; loopback unless ranks span machines.
    bind_host: str = "127.0.0.1"
    #: The hosts the ranks run on (`bench run --hosts`: HOST:SLOTS,..., filled in order from
    #: the first, which holds rank 0 and the rendezvous); '' = this machine.
    hosts: str = ""
    #: Name of the matrix this run belongs to (results/<matrix>/<run_id>).
    matrix: str = "adhoc"
    #: Convergence target (accuracy:V or loss:V) whose time the run finds to the iteration after
    #: training, from every worker's model after each step; '' = none (reports then interpolate
    #: between the evaluations at eval_interval_s).
    target: str = ""
    #: The emulated cluster's network (hetbench.network.model.NetworkConfig's fields, from a
    #: matrix's [network] table); {} = none: the host's own transport, host time.
    network: dict[str, Any] = field(default_factory=dict)
    #: `bench sim --learn`: the simulated workers train real models (sim/learn.py).
    learn: bool = False
    #: A learned simulation's costs from another workload (a matrix's [timing] table:
    #: `workload = "resnet50"` and that workload's options, e.g. compute_preset): its message
    #: sizes and compute time, while the math stays `workload`'s; {} = the workload's own.
    timing: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.workers < 2:
            raise UserError(f"workers must be >= 2 (distributed training), got {self.workers}")
        if self.iterations is None and self.seconds is None:
            raise UserError("give a budget: --iterations N and/or --seconds S")
        if self.iterations is not None and self.iterations <= self.warmup_iterations:
            raise UserError(
                f"iterations ({self.iterations}) must exceed warmup_iterations "
                f"({self.warmup_iterations}), or throughput has no window to measure"
            )
        if self.seconds is not None and self.seconds <= 0:
            raise UserError(f"seconds must be > 0, got {self.seconds}")
        if self.seed < 0:  # numpy's and torch's generators take none below 0
            raise UserError(f"seed must be >= 0, got {self.seed}")
        if self.pace_ms < 0:
            raise UserError(f"pace_ms must be >= 0, got {self.pace_ms}")
        if self.warmup_iterations < 0:
            raise UserError(f"warmup_iterations must be >= 0, got {self.warmup_iterations}")
        if self.comm_timeout_s <= 0:
            raise UserError(f"comm_timeout_s must be > 0, got {self.comm_timeout_s}")
        if self.eval_interval_s <= 0:
            raise UserError(f"eval_interval_s must be > 0, got {self.eval_interval_s}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise UserError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.target:
            from hetbench.core.target import parse_target

            object.__setattr__(self, "target", parse_target(self.target).spec)
        launcher_kind(self.launcher)  # a registered launcher, or one line naming them
        # Resolve options against the components' Config classes: fills defaults and rejects
        # unknown keys and bad values here, not inside a worker.
        algo_cls = self.algorithm_class()
        algo_cfg = build_config(algo_cls.Config, self.algorithm_options,
                                f"algorithm {self.algorithm}")
        # Every later question gets the typed options validated here (algorithm_config()).
        object.__setattr__(self, "_algorithm_config", algo_cfg)
        if self.hosts:
            self._check_hosts()
            if why := algo_cls.one_host_only(algo_cfg):
                raise UserError(f"algorithm {self.algorithm}: {why}; it cannot run with --hosts")
        algo_cls.validate(algo_cfg, self.workers)
        load_cls = self.workload_class()
        load_cfg = build_config(load_cls.Config, self.workload_options, f"workload {self.workload}")
        load_cfg = _with_preset_compute(self.workload, self.workload_options, load_cfg)
        object.__setattr__(self, "_workload_config", load_cfg)
        load_cls.validate(load_cfg)
        if getattr(load_cfg, "compute", "real") == "emulated" and (
                why := algo_cls.needs_real_compute(algo_cfg)):
            raise UserError(f"algorithm {self.algorithm}: {why}; it cannot run with workload "
                            f"{self.workload} compute = \"emulated\" (no backward pass)")
        injector = self.injector()
        injector.validate(self.workers)
        if injector.network_kind and not self.network:
            raise UserError(f"slowdown {self.slowdown!r} slows NICs: it needs a network model "
                            "(a [network] table in the matrix)")
        if self.network:
            from hetbench.network.model import resolve_network

            object.__setattr__(self, "network", resolve_network(self.network))
            if self.network.get("transport") == "fair":
                self._check_fair(injector)
            if why := algo_cls.outside_comm(algo_cfg):
                raise UserError(f"algorithm {self.algorithm}: {why}, so a network model cannot "
                                "shape it; drop [network] or use a Comm implementation")
        if self.timing:
            object.__setattr__(self, "timing", self._resolved_timing())
            self.timing_config  # noqa: B018 (validates the timing workload's run now)
        from hetbench.core.faults import parse_fault

        parse_fault(self.fault, self.workers)
        object.__setattr__(self, "algorithm_options", dataclasses.asdict(algo_cfg))
        object.__setattr__(self, "workload_options", dataclasses.asdict(load_cfg))

    def _check_fair(self, injector) -> None:
        """What `transport = "fair"` does not model yet, refused for bench sim and bench run
        alike: its flows' shares are computed over fixed NIC speeds, and its collectives are
        rings."""
        if self.network.get("collective", "ring") != "ring":
            raise UserError("[network] transport = \"fair\" moves ring collectives as flows; "
                            f"collective = \"{self.network['collective']}\" is not modeled as "
                            "flows yet: use transport = \"fcfs\"")
        if injector.network_kind:
            raise UserError(f"[network] transport = \"fair\" with slowdown {self.slowdown!r}: "
                            "slowed NICs are not modeled in fair flows yet; use transport = "
                            "\"fcfs\"")

    def _check_hosts(self) -> None:
        """Hosts only where a launcher starts ranks on them, every rank placed, and a rendezvous
        other hosts can reach; `hosts` kept in one spelling (a hostfile's contents, not its
        path: the run id must not change with where the file is)."""
        from hetbench.core.hosts import parse_hosts, place

        kind = launcher_kind(self.launcher)
        if not kind.across_hosts:
            across = " or ".join(k.name for k in KINDS.values() if k.across_hosts)
            raise UserError(f"--hosts starts ranks on other hosts through {across}; launcher "
                            f"{self.launcher} " + (f"runs on this machine: add --launcher "
                                                   f"{across}" if kind.on_this_machine
                                                   else "places them itself (drop --hosts)"))
        hosts = parse_hosts(self.hosts)
        place(hosts, self.world_size)
        if self.network:
            raise UserError("a [network] model emulates a cluster on one host (its ranks share "
                            "one clock and one file); drop --hosts, or drop the network model "
                            "to measure the hosts' own links")
        if self.bind_host.startswith("127.") or self.bind_host in ("localhost", "::1"):
            raise UserError(f"bind_host {self.bind_host} is loopback: ranks on other hosts could "
                            "not reach the run's services; use 0.0.0.0 (the default with --hosts)"
                            " or an address of this host")
        object.__setattr__(self, "hosts", ",".join(f"{h.host}:{h.slots}" for h in hosts))

    def _resolved_timing(self) -> dict[str, Any]:
        """The [timing] table with its workload's options resolved (defaults, preset compute),
        or UserError in one line."""
        from hetbench.core.registry import WORKLOADS

        options = dict(self.timing)
        name = options.pop("workload", None)
        if not isinstance(name, str) or not name:
            raise UserError("[timing] needs `workload = \"NAME\"`: the workload whose message "
                            "sizes and compute time the simulation takes")
        if not self.learn:
            raise UserError("[timing] gives a learned simulation (bench sim --learn) another "
                            f"workload's costs; without learning, simulate {name} itself "
                            "(put it in `workloads`)")
        cls = WORKLOADS.get(name)
        cfg = build_config(cls.Config, options, f"[timing] workload {name}")
        cfg = _with_preset_compute(name, options, cfg)
        cls.validate(cfg)
        return {"workload": name, **dataclasses.asdict(cfg)}

    @functools.cached_property
    def timing_config(self) -> RunConfig:
        """The config whose costs a simulation plays: this one, or with [timing] the same run
        of the timing workload (its messages and compute; never its math)."""
        if not self.timing:
            return self
        options = dict(self.timing)
        workload = options.pop("workload")
        return dataclasses.replace(self, workload=workload, workload_options=options, timing={},
                                   learn=False, target="")

    # -- components --------------------------------------------------------------------------
    def algorithm_class(self):
        from hetbench.core.registry import ALGORITHMS

        return ALGORITHMS.get(self.algorithm)

    def workload_class(self):
        from hetbench.core.registry import WORKLOADS

        return WORKLOADS.get(self.workload)

    def code_record(self) -> dict[str, dict[str, str]]:
        """{"code": which code implements this config's algorithm and workload}, for its
        summary.json (core/identity.py). Not part of the run id, so stored results keep
        theirs; the runner reruns a finished run whose recorded code is not the current."""
        from hetbench.core.identity import code_record

        return code_record(self)

    def algorithm_config(self):
        """The algorithm's typed options (its frozen Config), as validation built them."""
        return self._algorithm_config

    def workload_config(self):
        """The workload's typed options (its Config), as validation built them."""
        return self._workload_config

    def injector(self):
        """A new injector each call: it draws as the run goes, so each user gets its own."""
        from hetbench.slowdown import parse_slowdown

        injector = parse_slowdown(self.slowdown, seed=self.seed)
        injector.validate(self.workers)
        return injector

    @property
    def world_size(self) -> int:
        return self.workers + self.algorithm_class().server_ranks(self.algorithm_config(),
                                                                 self.workers)

    @property
    def synthetic(self) -> bool:
        return self.workload_class().is_synthetic(self.workload_config())

    @property
    def data_source(self) -> str:
        return self.workload_class().data_source(self.workload_config())

    @property
    def compute(self) -> str:
        return self.workload_options.get("compute", "real")

    @property
    def dilation(self) -> float:
        """Host seconds per cluster second (the network model's dilation; 1 without one)."""
        return float(self.network.get("dilation", 1.0))

    @property
    def host_timeout_s(self) -> float:
        """comm_timeout_s in host seconds: stretched by the dilation."""
        return self.comm_timeout_s * self.dilation

    def cluster(self):
        """The run's Cluster (hetbench.network.model), or None without [network]."""
        if not self.network:
            return None
        from hetbench.network.model import Cluster, NetworkConfig

        return Cluster(NetworkConfig(**self.network), self.workers, self.world_size,
                            self.injector().nic_factor)

    # -- identity and storage ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        return cls(**data)

    # Cached: the worker loop stamps run_id on every event, and hashing the whole config on
    # every iteration would be a measurable part of the harness's own overhead.
    @functools.cached_property
    def config_hash(self) -> str:
        identity = self.to_dict()
        # The matrix name says where a run is stored, not what it is.
        identity.pop("matrix")
        if not identity["target"]:
            # Runs without a target keep the ids they had before targets were part of a run.
            identity.pop("target")
        if not identity["network"]:  # likewise runs without a network model
            identity.pop("network")
        if not identity["learn"]:  # and simulations without learning
            identity.pop("learn")
        if not identity["hosts"]:  # and runs on one machine
            identity.pop("hosts")
        if not identity["timing"]:  # and simulations with the workload's own costs
            identity.pop("timing")
        # Likewise for options added to an algorithm or workload after runs of it were stored.
        for key, config_cls in (("algorithm_options", self.algorithm_class().Config),
                                ("workload_options", self.workload_class().Config)):
            options = identity[key]
            for name, default in added_later_defaults(config_cls).items():
                if options.get(name) == default:
                    options.pop(name)
        blob = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    @functools.cached_property
    def run_id(self) -> str:
        slow = re.sub(r"[^A-Za-z0-9.]+", "_", self.slowdown).strip("_")
        return (f"{self.algorithm}-{self.workload}-w{self.workers}-{slow}-s{self.seed}-"
                f"{self.config_hash}")

    def label(self, name: str | None = None) -> str:
        """One line for progress and listings; `name` is the algorithm's variant name when a
        matrix runs it with several option sets (hetbench.core.variants)."""
        timing = f" (timing of {self.timing['workload']})" if self.timing else ""
        return (f"{name or self.algorithm} {self.workload}{timing} w={self.workers} "
                f"{self.slowdown} seed={self.seed}")


def _with_preset_compute(workload: str, given_options: dict[str, Any], load_cfg):
    """A workload's resolved options with compute_ms from its compute_preset, if it names one
    (`given_options`: as the matrix gave them)."""
    preset = getattr(load_cfg, "compute_preset", "")
    if not preset:
        return load_cfg
    from hetbench.core.compute_presets import preset_compute_ms

    if load_cfg.compute != "emulated":
        raise UserError(f"workload {workload}: compute_preset {preset!r} sets the "
                        "emulated compute time; it needs compute = \"emulated\"")
    ms = preset_compute_ms(preset, workload, load_cfg)
    given = given_options.get("compute_ms")
    if given is not None and given != ms:  # a config.json read back holds the preset's
        raise UserError(f"workload {workload}: compute_ms = {given} and compute_preset "
                        f"{preset!r} ({ms} ms) disagree; set one of them")
    return dataclasses.replace(load_cfg, compute_ms=ms)
