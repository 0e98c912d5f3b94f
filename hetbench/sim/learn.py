"""Learning in the simulator (`bench sim --learn`): every simulated worker holds real parameters
and trains on the workload's real minibatches, and the protocol's model operations (its
averages, its mixing) are applied to them in simulated-time order.

The workers' models are stacked: one tensor per parameter whose first dimension is the worker,
so the gradients of all workers in an iteration are one batched operation (torch.func: vmap over
grad of the workload's own loss). Each worker draws its minibatches from its own stream, the
workload's train_batches(worker, workers) that a real worker draws from, so a run's results do
not depend on how its steps are batched, and a real run and its simulation train on the same
batches. The optimizer is the workload's: SGD with its lr, momentum and weight decay, applied as
torch.optim.SGD applies it.

What each protocol does to the models is its own (Protocol.learn, beside its timing and the
real step): this module only holds the models and the operations they are built from. This
first version plays protocols that run in lockstep (every worker's k-th step at once):
allreduce, ps-sync, local SGD, DiLoCo, D-PSGD, SGP and Prague's static schedule; the others
are refused with one line.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.func import grad, vmap
from torch.nn.utils.stateless import _reparametrize_module

from hetbench.core.config import RunConfig
from hetbench.core.store import EventLog
from hetbench.core.target import parse_target
from hetbench.errors import UserError

#: Workloads whose models the learning simulator trains (small models on data that ships).
LEARNABLE_WORKLOADS = ("mlp-digits", "svm", "cnn-cifar10")


def check_learnable(config: RunConfig, protocol, shared_cores: bool = False) -> None:
    """UserError (one line) unless `config` can be simulated with learning (`protocol`: its
    simulated protocol, the class or an instance; `shared_cores`: a --cores model)."""
    if config.workload not in LEARNABLE_WORKLOADS:
        raise UserError(f"bench sim --learn trains {', '.join(LEARNABLE_WORKLOADS)} "
                        f"(cnn-cifar10 with dataset = \"digits\"); not {config.workload}")
    if config.workload == "cnn-cifar10" and config.workload_options.get("dataset") != "digits":
        raise UserError("bench sim --learn trains cnn-cifar10 on dataset = \"digits\" only "
                        "(the data that ships); set [workload.cnn-cifar10] dataset = \"digits\"")
    if config.compute == "emulated":
        raise UserError(f"bench sim --learn needs real compute: workload {config.workload} "
                        "has compute = \"emulated\" (no gradients to learn from)")
    if shared_cores or config.network or config.iterations is None:
        raise UserError("bench sim --learn plays an iteration of every worker at a time: it "
                        "needs an iteration budget, no shared --cores and no [network] table "
                        "yet")
    if getattr(protocol, "learn", None) is None or not protocol.lockstep:
        raise UserError(f"bench sim --learn: algorithm {config.algorithm} has no learning half "
                        "yet (Protocol.learn); it plays allreduce, ps-sync, local-sgd, dpsgd, "
                        "sgp, diloco and prague-static")


class Learner:
    """All simulated workers' models, stacked, with the operations protocols apply to them."""

    def __init__(self, config: RunConfig, run_dir: Path):
        self.config = config
        self.run_dir = run_dir
        self.n = n = config.workers
        options = config.workload_config()
        self.lr, self.momentum = options.lr, options.momentum
        self.weight_decay = options.weight_decay
        self.workload = config.workload_class()(options, config.seed)
        torch.manual_seed(config.seed)  # the real worker's initial model, on every worker
        self.model = self.workload.build_model()
        if any(True for _ in self.model.buffers()):
            raise UserError(f"bench sim --learn: workload {config.workload}'s model keeps "
                            "buffers (batch norm), which the learning simulator does not "
                            "average yet")
        #: name -> [workers, *shape], every worker's copy of the parameter.
        self.params = {name: p.detach().unsqueeze(0).repeat(n, *([1] * p.dim())).contiguous()
                       for name, p in self.model.named_parameters()}
        self._momentum_buffers: dict[str, torch.Tensor] | None = None
        self._streams = [self._stream(w) for w in range(n)]
        self._gradients = vmap(grad(self._loss))
        self.records: list[dict[str, Any]] = []
        self._next_tick = 0
        #: The run's target, timed to the iteration: the averaged model is scored after every
        #: iteration until it meets it (cheap for the models learned here).
        self.target = parse_target(config.target) if config.target else None

    def _stream(self, worker: int):
        """Worker `worker`'s minibatches, its first drawn now: a shard too small for a batch
        is bad input, said before the run starts."""
        stream = self.workload.train_batches(worker, self.n)
        try:
            first = next(stream)
        except ValueError as exc:
            raise UserError(
                f"bench sim --learn: {exc} ({self.n} workers share {self.config.workload}'s "
                "training data): use fewer workers, a smaller batch_size, or svm's synthetic "
                "data with more samples") from None
        return itertools.chain([first], stream)

    # -- the model operations protocols use ---------------------------------------------------
    def _loss(self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
        with _reparametrize_module(self.model, params):
            return self.workload.loss(self.model, (x, y))

    def gradients(self) -> dict[str, torch.Tensor]:
        """Every worker's gradient of its next minibatch at its current model, stacked."""
        xs, ys = zip(*(next(stream) for stream in self._streams), strict=True)
        return self._gradients(self.params, torch.stack(xs), torch.stack(ys))

    def sgd_step(self, grads: dict[str, torch.Tensor]) -> None:
        """Every worker's optimizer step with its gradient: torch.optim.SGD's update
        (weight decay, then momentum with the first buffer the gradient itself)."""
        first = self._momentum_buffers is None
        if self.momentum and first:
            self._momentum_buffers = {}
        for name, p in self.params.items():
            g = grads[name]
            if self.weight_decay:
                g = g.add(p, alpha=self.weight_decay)
            if self.momentum:
                if first:
                    self._momentum_buffers[name] = g.clone()
                else:
                    self._momentum_buffers[name].mul_(self.momentum).add_(g)
                g = self._momentum_buffers[name]
            p.add_(g, alpha=-self.lr)

    @staticmethod
    def mean_over_workers(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each tensor replaced, on every worker, by its mean over the workers (an all-reduce
        average)."""
        return {name: t.mean(0, keepdim=True).expand_as(t).clone() for name, t in tensors.items()}

    def average_models(self) -> None:
        """Every worker's model becomes the workers' mean model."""
        self.params = self.mean_over_workers(self.params)

    def flat(self) -> torch.Tensor:
        """Every worker's parameters as one row each, [workers, model size], in the model's
        parameter order (flat_params' order); a new tensor."""
        return torch.cat([p.reshape(self.n, -1) for p in self.params.values()], dim=1)

    def set_flat(self, flat: torch.Tensor) -> None:
        """Every worker's parameters from rows as flat() gives them (cast to the model's
        dtype, as set_flat_params copies them)."""
        offset = 0
        for name, p in self.params.items():
            size = p[0].numel()
            # contiguous(): rows may be one row expanded (every worker takes the same model).
            self.params[name] = (flat[:, offset:offset + size].to(p.dtype).reshape(p.shape)
                                 .contiguous())
            offset += size

    def average_groups(self, groups) -> None:
        """Each group's members' models become the group's mean model (P-Reduce); workers in
        no group, or alone in one, keep theirs."""
        group_of = torch.arange(self.n)
        for index, members in enumerate(groups):
            if len(members) > 1:
                group_of[list(members)] = self.n + index
        met = group_of >= self.n
        if not met.any():
            return
        _, group_of = torch.unique(group_of, return_inverse=True)
        count = torch.bincount(group_of).unsqueeze(1)
        for name, p in self.params.items():
            flat = p.reshape(self.n, -1)
            sums = torch.zeros(int(group_of.max()) + 1, flat.shape[1], dtype=flat.dtype)
            sums.index_add_(0, group_of, flat)
            mean = sums / count
            self.params[name] = torch.where(met.unsqueeze(1), mean[group_of], flat).reshape(
                p.shape)

    def mix(self, peers: torch.Tensor, weights: torch.Tensor) -> None:
        """Gossip, every worker at once from the models before the mix: worker i's model
        becomes sum over m of weights[i, m] * x[peers[i, m]], summed in the order of m (the
        real step's: its own model first, then its in-neighbours'). `peers` and `weights` are
        [workers, m]; a row shorter than m is padded with weight 0."""
        for name, p in self.params.items():
            flat = p.reshape(self.n, -1)
            out = flat[peers[:, 0]] * weights[:, :1]
            for m in range(1, peers.shape[1]):
                out.add_(flat[peers[:, m]] * weights[:, m:m + 1])
            self.params[name] = out.reshape(p.shape)

    # -- what the run records --------------------------------------------------------------
    def evaluate_before(self, t_end: float, iteration: int) -> None:
        """Evaluations at every tick before `t_end` not yet made, of the models as they are
        (the iteration that ends at t_end has not been applied): what a real worker's snapshot
        at each tick holds."""
        interval = self.config.eval_interval_s
        while self._next_tick * interval < t_end:
            self.records.append({"kind": "snapshot", "wall_s": self._next_tick * interval,
                                 **self._score(iteration)})
            self._next_tick += 1

    def after_iteration(self, k: int, t_end: float) -> None:
        """With a target not met yet: whether the averaged model after iteration k meets it;
        the first time it does, a "target" record at the iteration's end (its last worker's),
        exact to the iteration, as a real run's search finds it to one step."""
        if self.target is None:
            return
        scores = self._mean_scores()
        if self.target.met(scores.get(self.target.column)):
            self.records.append({"kind": "target", "wall_s": t_end, "iteration": float(k + 1),
                                 "target": self.config.target, "resolution_iterations": 1,
                                 "probes": k + 1, "exact": True, "moment": "step end",
                                 **scores})
            self.target = None

    def finish(self, end_s: float, iterations: int) -> None:
        """The final evaluation, eval.jsonl, and (save_models) each worker's final model."""
        self.records.append({"kind": "final", "wall_s": end_s, **self._score(iterations)})
        log = EventLog(self.run_dir / "eval.jsonl")
        try:
            for record in self.records:
                log.append({"schema_version": 1, "run_id": self.config.run_id, **record})
        finally:
            log.close()
        if self.config.save_models:
            flat = torch.cat([p.reshape(self.n, -1) for p in self.params.values()], dim=1)
            for w in range(self.n):
                np.save(self.run_dir / f"model.rank{w}.npy", flat[w].numpy())

    def summary(self) -> dict[str, Any]:
        """The summary fields a real run computes from its evaluations."""
        final = next((r for r in reversed(self.records) if r["kind"] == "final"), {})
        snapshots = [r["consensus_distance"] for r in self.records if r["kind"] == "snapshot"]
        return {"final_test_loss": final.get("test_loss"),
                "final_test_accuracy": final.get("test_accuracy"),
                "final_consensus_distance": final.get("consensus_distance"),
                "mean_consensus_distance": (math.fsum(snapshots) / len(snapshots)
                                            if snapshots else None),
                "learned": True}

    @torch.no_grad()
    def _score(self, iteration: int) -> dict[str, Any]:
        mean = self.mean_over_workers(self.params)
        spread = sum(float((p - mean[name]).pow(2).sum()) for name, p in self.params.items())
        return {"iteration": float(iteration), "consensus_distance": spread / self.n,
                **self._mean_scores()}

    @torch.no_grad()
    def _mean_scores(self) -> dict[str, float]:
        """The workload's evaluation of the workers' averaged model."""
        mean = {name: p.mean(0) for name, p in self.params.items()}
        with _reparametrize_module(self.model, mean):
            return self.workload.evaluate(self.model)
