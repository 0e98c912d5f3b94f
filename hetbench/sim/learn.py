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

What each protocol does to the models is its own, beside its timing and the real step: this
module only holds the models and the operations they are built from. Protocols that run in
lockstep (every worker's k-th step at once: allreduce, ps-sync, local SGD, DiLoCo, D-PSGD, SGP,
Prague's static schedule) apply an iteration of every worker at once (Protocol.learn).
Event-driven protocols (ps-async, allreduce-backup, AD-PSGD, OSGP, Hop, Prague's generated
groups: Protocol.learns_events) apply
each operation in their event handlers, in simulated-time order, on the rows of the workers it
involves. There a gradient is computed on the model the worker held when its compute began:
the engine calls begin(w) then, and the gradients of every worker in compute are computed
together, in one batch, the first time one of them is needed or one of their models is about
to change (flush): a batch holds exactly the models their compute started from, so the results
do not depend on how the work was batched. The other protocols are refused with one line.
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
from hetbench.core.rundir import RunDir
from hetbench.core.store import EventLog
from hetbench.core.target import parse_target
from hetbench.errors import UserError
from hetbench.workloads.data import ShardedBatches

#: Workloads whose models the learning simulator trains (small models on data that ships).
LEARNABLE_WORKLOADS = ("mlp-digits", "mlp-clusters", "svm", "cnn-cifar10")
#: The fewest models a gradient batch holds (Learner._batch_gradients pads smaller ones).
MIN_BATCH = 4


def check_learnable(config: RunConfig, protocol) -> None:
    """UserError (one line) unless `config` can be simulated with learning (`protocol`: its
    simulated protocol, the class or an instance)."""
    if config.workload not in LEARNABLE_WORKLOADS:
        raise UserError(f"bench sim --learn trains {', '.join(LEARNABLE_WORKLOADS)} "
                        f"(cnn-cifar10 with dataset = \"digits\"); not {config.workload}")
    if config.workload == "cnn-cifar10" and config.workload_options.get("dataset") != "digits":
        raise UserError("bench sim --learn trains cnn-cifar10 on dataset = \"digits\" only "
                        "(the data that ships); set [workload.cnn-cifar10] dataset = \"digits\"")
    if config.compute == "emulated":
        raise UserError(f"bench sim --learn needs real compute: workload {config.workload} "
                        "has compute = \"emulated\" (no gradients to learn from)")
    events = protocol.learns_events
    if config.iterations is None:
        raise UserError("bench sim --learn needs an iteration budget (iterations = N): a run "
                        "ends when every worker has taken its steps")
    if not events and (protocol.learn is None or not protocol.lockstep):
        raise UserError(f"bench sim --learn: algorithm {config.algorithm} has no learning half "
                        "yet (Protocol.learn); it plays allreduce, ps-sync, ps-async, "
                        "allreduce-backup, adpsgd, hop, local-sgd, dpsgd, sgp, osgp, diloco, "
                        "async-diloco, dropcompute, batch-balance, prague-static, prague-smart "
                        "and prague-random")


def check_shards(config: RunConfig) -> None:
    """UserError (one line) when a worker's shard of the training data is too small for a
    batch (the last worker's is the smallest), said before any run starts."""
    workload = config.workload_class()(config.workload_config(), config.seed)
    try:
        next(workload.train_batches(config.workers - 1, config.workers))
    except ValueError as exc:
        raise UserError(_shard_message(exc, config)) from None


def _shard_message(exc: Exception, config: RunConfig) -> str:
    return (f"bench sim --learn: {exc} ({config.workers} workers share {config.workload}'s "
            "training data): use fewer workers, a smaller batch_size, or svm's synthetic data "
            "with more samples")


class Learner:
    """All simulated workers' models, stacked, with the operations protocols apply to them."""

    def __init__(self, config: RunConfig, run_dir: Path):
        self.config = config
        self.run_dir = run_dir
        self.n = n = config.workers
        options = config.workload_config()
        self.lr, self.momentum = options.lr, options.momentum
        self.weight_decay = options.weight_decay
        #: Samples a worker's minibatch holds (gradients(samples=...) takes fewer of them).
        self.batch_size = options.batch_size
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
        #: gradients(stream=True): the samples of each worker's current minibatch not taken
        #: yet, (x, y), by worker.
        self._rest: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        #: When every worker's stream indexes the same tensors (data.ShardedBatches), their
        #: batches are gathered in one indexing per gradient batch: (x, y), else None.
        first = self._streams[0]
        self._gather = ((first.x, first.y) if all(
            isinstance(s, ShardedBatches) and s.x is first.x and s.y is first.y
            for s in self._streams) else None)
        self._gradients = vmap(grad(self._loss))
        self.records: list[dict[str, Any]] = []
        self._next_tick = 0
        #: The run's target, timed to the iteration: the evaluated model is scored after every
        #: iteration until it meets it (cheap for the models learned here).
        self.target = parse_target(config.target) if config.target else None
        #: The first step end at which the evaluated model met the target (after_iteration).
        self._crossing: dict[str, Any] | None = None
        #: False: every gradient computed alone (the tests' reference for batching).
        self.batching = True
        # -- the event-driven protocols' state (begin / gradient / the row operations) --------
        #: Workers whose compute began and whose gradient is not computed yet, and gradients
        #: computed and not yet used, by worker.
        self._pending: set[int] = set()
        self._grads: dict[int, dict[str, torch.Tensor]] = {}
        #: Every worker's momentum buffer for row-wise steps (zeros: torch.optim.SGD's first
        #: buffer is the gradient itself, which momentum x 0 + g gives exactly).
        self._row_momentum: dict[str, torch.Tensor] | None = None
        #: A parameter server's (or aggregator's) model and momentum buffer, made on first use.
        self.server: dict[str, torch.Tensor] | None = None
        self._server_momentum: dict[str, torch.Tensor] | None = None
        #: The moment of the next evaluation tick, and the step ends seen (event mode).
        self.next_tick_s = 0.0
        self._steps_ended = 0
        self.last_end_s = 0.0
        #: Which model the run scores (Algorithm.evaluated_model): the workers' mean model,
        #: the server's (`server`: its model, or every worker's where they all take it, as
        #: ps-sync's protocol says), or one the protocol keeps (`evaluated_flat`).
        self.evaluated_model = config.algorithm_class().evaluated_model
        #: That model of the protocol's own, flat (flat_params' order), as its learn keeps it
        #: (DiLoCo's outer model); None until made: every worker's common initial model.
        self.evaluated_flat: torch.Tensor | None = None

    def _stream(self, worker: int):
        """Worker `worker`'s minibatches, its first drawn now: a shard too small for a batch
        is bad input, said before the run starts."""
        stream = self.workload.train_batches(worker, self.n)
        try:
            if isinstance(stream, ShardedBatches):
                stream.check()
                return stream
            first = next(stream)
        except ValueError as exc:
            raise UserError(_shard_message(exc, self.config)) from None
        return itertools.chain([first], stream)

    # -- the model operations protocols use ---------------------------------------------------
    def _loss(self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
        with _reparametrize_module(self.model, params):
            return self.workload.loss(self.model, (x, y))

    def gradients(self, samples=None, *, stream: bool = False) -> dict[str, torch.Tensor]:
        """Every worker's gradient of its next minibatch at its current model, stacked.
        `samples` (one count per worker): each worker's gradient over only the first
        samples[w] samples of its minibatch, the micro-batches it computed (an algorithm that
        owns its compute: DropCompute); its minibatch is drawn whole either way, as a real
        worker skips the samples it dropped.

        `stream=True`: each worker's gradient over the next samples[w] samples of its stream,
        any count (above the batch size too), across its minibatches, the rest of a minibatch
        left for its next call: what a real worker's Work takes when it skips nothing (a
        batch balancer's batch of its own size; harness/work.py's SampleStream)."""
        if not stream:
            return self._batch_gradients(list(range(self.n)), samples)
        if samples is None:
            raise ValueError("gradients(stream=True) takes one count of samples per worker")
        taken = [self._take(w, int(samples[w])) for w in range(self.n)]
        out = {name: torch.empty_like(p) for name, p in self.params.items()}
        counts = [len(x) for x, _ in taken]
        for count in sorted(set(counts)):  # a vmap needs one batch length
            rows = [w for w, c in enumerate(counts) if c == count]
            index = torch.tensor(rows)
            x = torch.stack([taken[w][0] for w in rows])
            y = torch.stack([taken[w][1] for w in rows])
            grads = self._padded({name: p[index] for name, p in self.params.items()}, x, y,
                                 slice(0, len(rows)))
            for name, g in grads.items():
                out[name][index] = g
        return out

    def _take(self, w: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Worker w's next `count` samples of its stream, across its minibatches."""
        if count < 1:
            raise ValueError("a gradient over no samples: compute at least one")
        xs, ys = [], []
        while count > 0:
            x, y = self._rest.pop(w, None) or next(self._streams[w])
            xs.append(x[:count])
            ys.append(y[:count])
            if len(x) > count:
                self._rest[w] = (x[count:], y[count:])
            count -= min(count, len(x))
        return (xs[0], ys[0]) if len(xs) == 1 else (torch.cat(xs), torch.cat(ys))

    def _batch_gradients(self, rows: list[int], samples=None) -> dict[str, torch.Tensor]:
        """The gradients of workers `rows` (each of its next minibatch at its current model),
        stacked in that order: one vmap call, or one per worker with batching off.

        A batch of one or two models takes other kernels than a larger one (cnn-cifar10's
        convolutions give other bits; measured), so a batch is padded with copies of its last
        row to at least MIN_BATCH: a worker's gradient is then the same bits whatever else was
        in its batch (each row's result depends only on its own model and data)."""
        if self._gather is not None:  # the same batches, one indexing for all of them
            index = torch.from_numpy(np.stack([self._streams[w].next_indices() for w in rows]))
            x, y = self._gather[0][index], self._gather[1][index]
        else:
            xs, ys = zip(*(next(self._streams[w]) for w in rows), strict=True)
            x, y = torch.stack(xs), torch.stack(ys)
        if rows == list(range(self.n)):
            params = self.params
        else:
            index = torch.tensor(rows)
            params = {name: p[index] for name, p in self.params.items()}
        if samples is not None and any(samples[w] != x.shape[1] for w in rows):
            return self._first_samples_gradients(params, x, y, [samples[w] for w in rows])
        if not self.batching:
            parts = [self._padded(params, x, y, slice(i, i + 1)) for i in range(len(rows))]
            return {name: torch.cat([part[name] for part in parts]) for name in params}
        return self._padded(params, x, y, slice(0, len(rows)))

    def _first_samples_gradients(self, params, x, y, counts: list[int]):
        """Each row's gradient over its first counts[i] samples: one vmap per distinct count
        (a vmap needs one batch length)."""
        out = {name: torch.empty_like(p) for name, p in params.items()}
        for count in sorted(set(counts)):
            if count < 1:
                raise ValueError("a gradient over no samples: compute at least one")
            rows = [i for i, c in enumerate(counts) if c == count]
            index = torch.tensor(rows)
            grads = self._padded({name: p[index] for name, p in params.items()},
                                 x[index][:, :count], y[index][:, :count], slice(0, len(rows)))
            for name, g in grads.items():
                out[name][index] = g
        return out

    def _padded(self, params, x, y, rows: slice) -> dict[str, torch.Tensor]:
        count = rows.stop - rows.start
        if count >= MIN_BATCH:
            return self._gradients({name: p[rows] for name, p in params.items()}, x[rows],
                                   y[rows])
        pad = [rows.start + min(i, count - 1) for i in range(MIN_BATCH)]
        grads = self._gradients({name: p[pad] for name, p in params.items()}, x[pad], y[pad])
        return {name: g[:count] for name, g in grads.items()}

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

    @staticmethod
    def mean_by_samples(tensors: dict[str, torch.Tensor], samples) -> dict[str, torch.Tensor]:
        """Each tensor replaced, on every worker, by its mean over the workers weighted by
        `samples` (one count per worker): of per-worker mean gradients, the gradient over every
        sample computed anywhere (a sample-weighted all-reduce: DropCompute, batch-balance)."""
        weights = torch.tensor(list(samples), dtype=torch.float64)
        return {name: (t.double() * weights.view(-1, *[1] * (t.dim() - 1))).sum(0, keepdim=True)
                .div(weights.sum()).to(t.dtype).expand_as(t).clone()
                for name, t in tensors.items()}

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
        if len(groups) == 1:  # one meeting (event by event): its members' rows only
            self._average_members(sorted(set(groups[0])))
            return
        group_of = torch.arange(self.n)
        for index, members in enumerate(groups):
            if len(members) > 1:
                group_of[list(members)] = self.n + index
        met = group_of >= self.n
        if not met.any():
            return
        self._writing(met.nonzero().flatten().tolist())
        _, group_of = torch.unique(group_of, return_inverse=True)
        count = torch.bincount(group_of).unsqueeze(1)
        for name, p in self.params.items():
            flat = p.reshape(self.n, -1)
            sums = torch.zeros(int(group_of.max()) + 1, flat.shape[1], dtype=flat.dtype)
            sums.index_add_(0, group_of, flat)
            mean = sums / count
            self.params[name] = torch.where(met.unsqueeze(1), mean[group_of], flat).reshape(
                p.shape)

    def _average_members(self, members: list[int]) -> None:
        """One group's mean, written to its members' rows: the bits of average_groups' general
        path (a sum from zero in row order, then one division), at the cost of the group's rows
        instead of every worker's (event-by-event protocols meet a group at a time: at 1,024
        workers the general path was most of prague-smart's learned run)."""
        if len(members) < 2:
            return
        self._writing(members)
        index = torch.tensor(members)
        for p in self.params.values():
            rows = p[index]
            total = rows[0].clone()
            for row in rows[1:]:
                total.add_(row)
            p[index] = total / len(members)

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

    # -- event-driven protocols: one worker's operations at a time ---------------------------
    def begin(self, w: int) -> None:
        """Worker w's compute begins: its gradient is of the model it holds now."""
        self._pending.add(w)

    def gradient(self, w: int) -> dict[str, torch.Tensor]:
        """Worker w's gradient (of its next minibatch at the model its compute began with)."""
        if w in self._pending:
            self.flush()
        return self._grads.pop(w)

    def flush(self) -> None:
        """Compute every pending gradient, one batch over the workers in compute (each draws
        its own next minibatch: its stream's order is its iterations', whatever the batch)."""
        if not self._pending:
            return
        rows = sorted(self._pending)
        self._pending.clear()
        grads = self._batch_gradients(rows)
        for i, w in enumerate(rows):
            self._grads[w] = {name: g[i] for name, g in grads.items()}

    def _writing(self, rows) -> None:
        """Rows are about to change: gradients due from their current models come first."""
        if self._pending and not self._pending.isdisjoint(rows):
            self.flush()

    def _sgd(self, p: torch.Tensor, g: torch.Tensor, buffer: torch.Tensor | None) -> None:
        """torch.optim.SGD's update of one model `p` in place (buffer: its momentum's)."""
        if self.weight_decay:
            g = g.add(p, alpha=self.weight_decay)
        if buffer is not None:
            buffer.mul_(self.momentum).add_(g)
            g = buffer
        p.add_(g, alpha=-self.lr)

    def worker_step(self, w: int, grads: dict[str, torch.Tensor]) -> None:
        """Worker w's optimizer step with `grads` on the model it holds now."""
        self._writing((w,))
        if self.momentum and self._row_momentum is None:
            self._row_momentum = {name: torch.zeros_like(p) for name, p in self.params.items()}
        for name, p in self.params.items():
            self._sgd(p[w], grads[name],
                      None if self._row_momentum is None else self._row_momentum[name][w])

    def server_step(self, grads: dict[str, torch.Tensor]) -> None:
        """The server's optimizer step with `grads` (its model starts as every worker's)."""
        server = self._server_model()
        if self.momentum and self._server_momentum is None:
            self._server_momentum = {name: torch.zeros_like(p) for name, p in server.items()}
        for name, p in server.items():
            self._sgd(p, grads[name],
                      None if self._server_momentum is None else self._server_momentum[name])

    def take_server(self, w: int) -> None:
        """Worker w's model becomes the server's (the reply it receives)."""
        self._writing((w,))
        for name, p in self._server_model().items():
            self.params[name][w] = p

    def _server_model(self) -> dict[str, torch.Tensor]:
        if self.server is None:  # every worker starts from the same model: the server's
            self.server = {name: p[0].clone() for name, p in self.params.items()}
        return self.server

    def pair_average(self, i: int, j: int) -> None:
        """Workers i and j both take the mean of their two models (AD-PSGD's atomic average)."""
        self._writing((i, j))
        for p in self.params.values():
            mean = (p[j] + p[i]) / 2
            p[i] = mean
            p[j] = mean

    def row(self, w: int) -> torch.Tensor:
        """Worker w's parameters as one flat vector (flat_params' order); a new tensor."""
        return torch.cat([p[w].reshape(-1) for p in self.params.values()])

    def set_row(self, w: int, flat: torch.Tensor) -> None:
        """Worker w's parameters from a flat vector (cast to the model's dtype)."""
        self._writing((w,))
        offset = 0
        for p in self.params.values():
            size = p[w].numel()
            p[w] = flat[offset:offset + size].to(p.dtype).reshape(p[w].shape)
            offset += size

    @staticmethod
    def mean_of(grads: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The mean of several workers' gradients, summed in the order given."""
        total = {name: g.clone() for name, g in grads[0].items()}
        for other in grads[1:]:
            for name, g in other.items():
                total[name].add_(g)
        return {name: g.div_(len(grads)) for name, g in total.items()}

    def step_ended(self, t_end: float, iterations: list[int]) -> None:
        """A worker's step ended at t_end (event mode): with a target, the evaluated model is
        scored once per n step ends, the moment about one step of every worker has passed."""
        self.last_end_s = max(self.last_end_s, t_end)
        self._steps_ended += 1
        if self.target is not None and self._steps_ended % self.n == 0:
            self.after_iteration(self._steps_ended // self.n - 1, t_end,
                                 iteration=sum(iterations) / self.n)

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
        self.next_tick_s = self._next_tick * interval

    def after_iteration(self, k: int, t_end: float, iteration: float | None = None) -> None:
        """With a target not met yet: whether the evaluated model after iteration k meets it;
        the first time it does, the candidate "target" record at the iteration's end (its last
        worker's), exact to the iteration, as a real run's search finds it to one step
        (`iteration`: the workers' mean iteration then, where they are not all at k + 1).
        finish() keeps it only where an evaluation met the target too (`_crossing`)."""
        if self.target is None or self._crossing is not None:
            return
        scores = self._evaluated_scores()
        if self.target.met(scores.get(self.target.column)):
            self._crossing = {"kind": "target", "wall_s": t_end,
                              "iteration": float(k + 1) if iteration is None else iteration,
                              "target": self.target.spec, "resolution_iterations": 1,
                              "probes": k + 1, "exact": True, "moment": "step end", **scores}

    def finish(self, end_s: float, iterations: int) -> None:
        """The final evaluation, the time to target, eval.jsonl, and (save_models) each
        worker's final model.

        The time to target follows a real run's rule (harness/evaluation.py): a run has one
        only when one of its evaluations (the snapshots at eval_interval_s, or the final) met
        the target; it is then the first step end at which the evaluated model did. A crossing
        between two evaluations that both missed is what a real run cannot see, so a learned
        run does not count it either: the two would otherwise disagree on which cells reached
        the target."""
        self.records.append({"kind": "final", "wall_s": end_s, **self._score(iterations)})
        if self._crossing is not None and any(
                self.target.met(r.get(self.target.column)) for r in self.records):
            self.records.append(self._crossing)
        log = EventLog(RunDir(self.run_dir).evaluations)
        try:
            for record in self.records:
                log.append({"schema_version": 1, "run_id": self.config.run_id, **record})
        finally:
            log.close()
        if self.config.save_models:
            flat = torch.cat([p.reshape(self.n, -1) for p in self.params.values()], dim=1)
            for w in range(self.n):
                np.save(self.run_dir / f"model.rank{w}.npy", flat[w].numpy())
            np.save(self.run_dir / "model.evaluated.npy", torch.cat(
                [p.reshape(-1) for p in self.evaluated().values()]).numpy())

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
                **self._evaluated_scores()}

    @torch.no_grad()
    def evaluated(self) -> dict[str, torch.Tensor]:
        """The model the run scores (`evaluated_model`), by parameter name."""
        if self.evaluated_model == "server":
            return self._server_model()
        if self.evaluated_model != "workers" and self.evaluated_flat is not None:
            flat, offset, model = self.evaluated_flat, 0, {}
            for name, p in self.params.items():
                size = p[0].numel()
                model[name] = flat[offset:offset + size].to(p.dtype).reshape(p[0].shape)
                offset += size
            return model
        return {name: p.mean(0) for name, p in self.params.items()}

    @torch.no_grad()
    def _evaluated_scores(self) -> dict[str, float]:
        """The workload's evaluation of the model the run scores."""
        with _reparametrize_module(self.model, self.evaluated()):
            return self.workload.evaluate(self.model)
