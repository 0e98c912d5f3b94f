"""The Algorithm interface every synchronization algorithm implements, and StepInfo.

Plugins import these from hetbench.api, whose module docstring is the contract: when the harness
calls each method, what a step returns, which Comm primitive serves which pattern, and the
simulated and learning halves (`python -c "import hetbench.api; help(hetbench.api)"`). The
docstrings below detail each member.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from hetbench.core.config import RunConfig
from hetbench.core.context import WorkerContext
from hetbench.core.waits import WaitRule
from hetbench.core.work import Work


@dataclass(frozen=True, kw_only=True)
class NoOptions:
    """An algorithm without options."""


@dataclass
class StepInfo:
    """What happened in one step, for the event log."""

    #: Seconds of the step spent blocked on peers (the rest of the step counts as communication).
    #: None: the seconds the step's point-to-point Comm operations blocked (send, recv, and
    #: the wait() of isend and irecv), which the harness records itself; a collective's wait
    #: is inferred by the reports from every member's arrival. Set it only for waits Comm
    #: does not see (a condition variable filled by a receiving thread, say).
    wait_s: float | None = None
    #: The worker's next iteration number when the algorithm jumps ahead (Hop's skipping).
    next_iteration: int | None = None
    #: Other workers whose models or gradients this step mixed into this worker's model (0: a
    #: purely local step). Reports turn it into synchronization health (the share of iterations
    #: that averaged with a peer, the mean group size); None means the algorithm does not say.
    peers: int | None = None
    #: The ranks this step synchronized with (its own excluded). None: the ranks the step's
    #: Comm operations involved, which the harness records itself. "Who waited for whom" then
    #: attributes the step's waiting to the one of them that arrived at this iteration last,
    #: inferred from their arrivals where the step logged no wait_s: for protocols whose
    #: peers meet at the same iteration (gossip, pairs, groups).
    peer_ranks: list[int] | None = None
    #: Seconds of wait_s by the rank whose message ended them, where the step knows (Hop's
    #: receiver notes the neighbour whose update or token made its condition true): "who
    #: waited for whom" then attributes exactly these (event field `waited_on`). None: the
    #: reports infer it from the ranks met and their arrivals.
    waited_on: dict[int, float] | None = None
    #: Mean age of what was mixed in, in iterations: how far the peers' models were from this
    #: worker's iteration (0 when everyone is at the same one). ps-async counts server updates.
    staleness: float | None = None
    #: True when the protocol threw this step's gradient away (synchronous SGD with backup
    #: workers drops the late ones): its samples then count toward no throughput, since no
    #: model learned from them (the event records them as samples_discarded).
    discarded: bool = False
    #: The samples this step's gradient came from. None: what the iteration's compute used
    #: (the batch size, or the samples an algorithm's own `compute` took through its Work).
    #: Throughput counts these, not the samples drawn: a dropped micro-batch trained nothing.
    samples: int | None = None
    #: Algorithm-specific event fields: group members, neighbours used, skipped iterations.
    #: A field named `*_s` is seconds measured on this host (like wait_s): the worker records
    #: it in cluster time (divided by an emulated network's dilation).
    fields: dict[str, Any] = field(default_factory=dict)


class Algorithm(ABC):
    """One synchronization algorithm; one instance per rank."""

    #: Registry name, e.g. "allreduce".
    name: ClassVar[str]
    #: One line for `bench list`.
    description: ClassVar[str]
    #: Frozen dataclass of options; `[algorithm.<name>]` in a matrix file fills it.
    Config: ClassVar[type] = NoOptions
    #: True when workers advance in lock step: a wall-clock budget is then agreed collectively
    #: each iteration so that no worker leaves a collective its peers are still in.
    synchronous: ClassVar[bool] = True

    def __init__(self, config: Any):
        self.config = config

    @classmethod
    def server_ranks(cls, config: Any, workers: int) -> int:
        """Ranks beyond the workers that this algorithm needs (a parameter server, say)."""
        return 0

    @classmethod
    @contextmanager
    def services(cls, run: RunConfig, run_dir: Path) -> Iterator[dict[str, Any]]:
        """Processes the run needs beside its ranks (Prague's Group Generator, say).

        `run` is the whole run's config (this algorithm's options: run.algorithm_config(); the
        seed, workers, bind_host), so a service need not read anything back from disk. The
        launcher enters this before starting any rank and leaves it after the last one ended,
        so a service never outlives its run. It yields what workers need to reach the services
        (e.g. {"gg_address": "127.0.0.1:50051"}); workers find it in ctx.services.
        """
        yield {}

    @classmethod
    def intended_sync_share(cls, config: Any, workers: int) -> float:
        """The share of iterations in which the protocol means a worker to average with at
        least one peer (StepInfo.peers > 0). A report flags runs that fall markedly below it:
        a throughput win bought by synchronizing less than the protocol intends."""
        return 1.0

    @classmethod
    def wait_rule(cls, config: Any, workers: int) -> str | WaitRule | None:
        """How the reports attribute this algorithm's waits to the workers waited on: a name
        from WAIT_RULES (what each means is there), or a WaitRule of the algorithm's own. A
        class attribute does as well (`wait_rule = "all"`) where options do not change it.
        None (the default, for algorithms written before it existed): the reports infer one
        from what the log holds (named where steps log waited_on, group where they log
        P-Reduce members, from where they name the ranks met). The run's summary.json records
        it (`wait_rule`), so reports need not import the algorithm."""
        return None

    @classmethod
    def optional_features(cls) -> dict[str, str | None]:
        """Options that need a separately installed back-end: {"option=value": None when it
        is available here, else how to get it}. `bench list` shows them."""
        return {}

    @classmethod
    def simulated_protocol(cls) -> type | None:
        """The class that plays this algorithm in `bench sim` (a hetbench.sim.protocol.Protocol
        subclass, defined beside the real step), or None: bench sim then refuses the algorithm
        with one line. Returned from a method so the class may follow the algorithm's."""
        return None

    @classmethod
    def validate(cls, config: Any, workers: int) -> None:
        """Raise UserError if `config` cannot run with `workers` workers."""

    @classmethod
    def needs_real_compute(cls, config: Any) -> str | None:
        """Why `config` cannot run under emulated compute (no forward/backward pass), or None.
        An option that acts inside backward (a DDP communication hook) would otherwise be
        silently skipped; the matrix is then refused before any process starts."""
        return None

    @classmethod
    def outside_comm(cls, config: Any) -> str | None:
        """Why `config` communicates outside Comm (through torch DDP or Horovod directly), or
        None. A run with a network model (`[network]`) shapes Comm's operations only, so such
        a config is refused there rather than measured on the host's own transport."""
        return None

    @classmethod
    def one_host_only(cls, config: Any) -> str | None:
        """Why `config` can only run with every rank on one host, or None; a run across hosts
        (`bench run --hosts`) of such a config is refused in one line saying this."""
        return None

    def setup(self, ctx: WorkerContext, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Called on every rank before training; collective group creation belongs here."""

    def compute(self, ctx: WorkerContext, model: nn.Module, work: Work) -> None:
        """This iteration's forward and backward, before `step`: leave the gradient of the
        samples used in `p.grad`.

        Not overridden (the default), the harness runs one batch of the workload's batch size
        itself, as fast as a plain training loop. An algorithm that changes how much a worker
        computes overrides it and takes its work from `work` (harness/work.py): `work.compute(n)`
        runs forward and backward over the next n samples of the worker's stream (a
        micro-batch), `work.skip(n)` drops n samples, `work.elapsed_s` is this iteration's
        compute so far (on a GPU, reading it waits for the queued micro-batches: read it only
        where a decision needs it) and `work.samples` the samples used. The pace floor
        and the injected slowdown apply to each micro-batch in proportion to its samples: a
        worker slowed k times takes k times as long on every micro-batch it computes, and
        computing all of a batch costs what one batch does, so cutting work cuts the delay.
        The harness leaves in `p.grad` the mean gradient over the samples used, and the step's
        event line counts them (StepInfo.samples). Under emulated compute, a micro-batch is
        a paced wait of its share of compute_ms, and the gradients are the fixed ones.
        """
        work.compute()

    @classmethod
    def owns_compute(cls) -> bool:
        """Whether the algorithm overrides `compute` (the harness then hands it a Work)."""
        return cls.compute is not Algorithm.compute

    def forward_module(self, model: nn.Module) -> nn.Module:
        """The module the harness runs each forward/backward through; `model` by default.

        An algorithm that synchronizes from inside forward/backward (torch DDP) returns its
        wrapper here. The parameters are `model`'s either way. Not called under emulated
        compute, which has no forward pass.
        """
        return model

    @abstractmethod
    def step(self, ctx: WorkerContext, model: nn.Module,
             optimizer: torch.optim.Optimizer) -> StepInfo:
        """Gradients are in `p.grad`: apply the local update and synchronize with peers."""

    def serve(self, ctx: WorkerContext, model: nn.Module,
              optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The whole life of a server rank (see server_ranks); returns when all workers are done,
        with what the server should record in its done.rank<r>.json (or None)."""
        raise NotImplementedError(f"{self.name} has no server ranks")

    #: The unit of each of summary_facts' values ({"outer_steps": "steps"}), shown beside its
    #: name in the report's table of the algorithm's own facts; a fact not named here has
    #: none.
    fact_units: ClassVar[dict[str, str]] = {}

    @classmethod
    def summary_facts(cls, config: Any, events: list[dict[str, Any]],
                      done: list[dict[str, Any] | None]) -> dict[str, Any]:
        """The algorithm's own facts for summary.json, from every worker's events (their
        StepInfo.fields included, in real and simulated runs alike) and every rank's done
        record (None for a rank without one; a simulated run has none): gradients dropped,
        outer steps, push-sum weights. The report shows them in a table per algorithm (with
        `fact_units`), and report.csv as `fact:<name>` columns. Nothing by default."""
        return {}

    @classmethod
    def facts_record(cls, facts: dict[str, Any]) -> dict[str, Any]:
        """summary_facts' values as a summary holds them: each at the top level (where scripts
        read them) and their names and units under "facts" (where the report finds them)."""
        return {**facts, "facts": {name: cls.fact_units.get(name, "") for name in facts}}

    #: Which model the run's evaluation scores (the snapshots at eval_interval_s, the final
    #: model, the time to target; summary.json's `evaluated_model` names it): the model the
    #: algorithm produces. "workers" (the default): the average of the workers' models.
    #: "server": the model of the first server rank (rank `workers`; server_ranks >= 1), whose
    #: serve() calls ctx.model_updated() after each update so that the harness keeps it.
    #: Any other value names a model every worker holds beside the one it trains (DiLoCo's
    #: "outer model"), which `evaluated_state` returns; the evaluation scores the workers'
    #: average of it. The consensus distance measures the workers' own models whatever this
    #: says.
    evaluated_model: ClassVar[str] = "workers"

    @classmethod
    def evaluated_model_name(cls) -> str:
        """How summary.json and the report name the evaluated model."""
        return {"workers": "workers' average"}.get(cls.evaluated_model, cls.evaluated_model)

    def evaluated_state(self, model: nn.Module) -> torch.Tensor:
        """On a worker, where `evaluated_model` names a model of the algorithm's own: that
        model now, as a new tensor laid out as flat_state(model) lays out `model`'s
        (parameters, then floating-point buffers; the worker's own buffers where the
        algorithm keeps none). The harness keeps it beside the worker's own model at each
        snapshot and, with a target, after each step."""
        raise NotImplementedError(f"{self.name} declares evaluated_model = "
                                  f"{self.evaluated_model!r} but no evaluated_state()")

    def finish(self, ctx: WorkerContext, model: nn.Module) -> dict[str, Any] | None:
        """Called on every worker after its budget is spent, before the final evaluation.

        Asynchronous algorithms drain here: answer peers' pending requests until all are done.
        Return what the drain did, for done.rank<r>.json: every averaging must be on record, so
        count those after the last iteration as {"averagings_after_training": n}.
        """
