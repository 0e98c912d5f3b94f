"""hetbench's public plugin API: what a plugin algorithm or workload imports, and nothing else.

    from hetbench.api import Algorithm, StepInfo, opt, UserError, flat_params, set_flat_params

Every name in `__all__` keeps working across releases; a rename keeps the old name importable
for one release, with a warning that names the new import. Every other module of hetbench is
internal and may move (the paths of release 0.1's first plugins, `hetbench.algorithms.base`,
`hetbench.harness.options`, `hetbench.harness.tensors` and `hetbench.harness.context` still
import, with such a warning, until the next release).

The real half of an algorithm
- `Algorithm` (subclass it), `StepInfo` (what `step` returns), `NoOptions`, `opt` (an option
  with its default and the doc `bench list` shows), `WorkerContext` (`ctx`: rank, workers,
  device, seeded rng, `comm`), `UserError` (bad options: one line, exit code 2).
- The work of a step: `compute(ctx, model, work)`, called before `step`. Not overridden, the
  harness runs one batch itself (as fast as a plain loop). An algorithm that changes how much
  a worker computes (DropCompute, a batch balancer) overrides it and takes micro-batches from
  `work` (a `Work`): `work.compute(n)` (forward and backward over the next n samples, their
  gradient added), `work.skip(n)` (drop n samples uncomputed), `work.elapsed_s` (this
  iteration's compute so far: its own clock; on a GPU reading it waits for the queued
  micro-batches, so read it where a decision needs it), `work.samples`,
  `work.micro_batches`, `work.batch_size`. The pace floor and the injected slowdown apply
  per micro-batch, in proportion to its samples; `p.grad` is then the mean over the samples
  used, and the step's event counts them (`StepInfo.samples` may say otherwise).
  `split_batch(batch, m)` gives the micro-batch sizes every half uses.
  algorithms/dropcompute.py is the worked example (all three halves).
- `Comm` (`ctx.comm`): all_reduce_, average_, broadcast_, barrier, group (fixed groups, made in
  setup), p_reduce_ (groups formed on the fly), send/recv/isend/irecv, channel and the *_on
  forms, rpc; `ReduceOp`; `CommMisuse` (an operation that could only hang, refused).
- How the reports attribute its waits ("who waited for whom"): `wait_rule`, a class attribute
  (or a classmethod of (options, workers)) naming one of `WAIT_RULES` ("all", "neighbours",
  "from", "group", "peer", "server", "quorum", "named"; the dict says what each reads from
  the log and how it attributes), or a `WaitRule` of the plugin's own. Undeclared, the
  reports infer one from the fields the steps log.
- The algorithm's own facts in the report: `summary_facts(config, events, done)` (a
  classmethod: counts from every worker's event lines, StepInfo.fields included, in real and
  simulated runs) and `fact_units` ({fact name: its unit}). summary.json holds them, and
  `bench report` shows them in a table per algorithm and as `fact:<name>` columns of
  report.csv.
- Which model the evaluation scores (accuracy at each snapshot, at the end, time to target;
  summary.json's `evaluated_model`): `evaluated_model`, a class attribute. "workers" (the
  default): the workers' average. "server": the first server rank's model, which its
  `serve()` reports after each update by calling `ctx.model_updated()` (after the update's
  replies are sent: the harness then reads a clock, and copies the model at each snapshot
  tick, or after every update when the run has a target). Any other value names a model each
  worker holds beside the one it trains (DiLoCo's "outer model"): `evaluated_state(model)`
  returns it on a worker, flat as `flat_state(model)` lays out the model (buffers
  included), and the workers' average of it is scored. The consensus distance is always the
  workers' own models'. In `bench sim --learn` a protocol sets `learner.server` (or
  `learner.evaluated_flat`, flat_params' order) to the model it declares.
- `now_ns()`: the run's clock (nanoseconds), rank 0's on every rank: a time a step logs that
  another rank's is compared with (an arrival, a skip) must be read from it, not from
  time.time_ns(), whose hosts' clocks differ across machines.
- Tensor helpers: params_of, flat_params, set_flat_params, flat_grads, set_flat_grads,
  flat_state, set_flat_state, flat_params_numel, buckets.

The simulated half (`bench sim`)
- `Protocol` (subclass it; `simulated_protocol()` returns the class): `help(Protocol)` lists
  what a protocol may read (`self.n`, `self.config`, `self.model_bytes`, `self.engine.now /
  iteration / t_sync / active`), the costs of `self.net` (`ring`, `rings`, `exchange`,
  `exchange_s`, `message_to`, `wire`, `p_reduce`, `rpc_one_way`: the same calls answer from an
  alpha-beta model or a `[network]` cluster) and what it calls (`self.engine.end_step(w,
  t_end, wait_s, fields, *, peers, staleness, discarded, peer_ranks)`, `done`, `at`).
- `Steps` (what a lockstep `step_all` returns: t_end and wait_s arrays, peers, staleness,
  fields and peer_ranks as lists of one per worker), `Partners` (the event path of a step k
  that waits for given partners' k-th gradients: neighbours, or everyone at an averaging
  step), `Meetings` (P-Reduce groups meeting on the fly)
  and `MemberCaches` (which member sets would hold a cached communicator: a miss pays
  `self.net.group_setup_s`).
- A protocol whose algorithm owns its compute sets `work(w, k, compute_s, factor)`: how much
  worker w computes in iteration k given a whole batch's compute time and its slowdown
  factor, returning (compute_s, slowdown_s, samples), decided by the same pure rule as the
  real half over the same per-micro-batch durations (compute_s * size / batch * factor). The
  engine times the gradient and counts the samples by it. A step may not end before its
  gradient is ready or before now: bench sim refuses it in one line naming the protocol.
- Server ranks: a protocol with `servers = 1` (a parameter server) has that many server
  processes always competing for the CPU (`self.engine.active` counts them); the server's
  own CPU time per message is `self.net.cpu_s` times `self.net.share(active)` (processor
  sharing over the cores), and a message's wire time `self.net.wire(src, dst, nbytes, at)`
  or `self.net.message_to(...)` (CPU included). ps.py's PSSyncSim and PSAsyncSim are the
  worked examples: a server that takes one push at a time keeps a `server_free` time.

The learning half (`bench sim --learn`)
- A lockstep protocol's `learn(k, learner)` applies the real step's math to every simulated
  worker at once; `learner` is a `Learner`, every worker's model stacked:
  `learner.gradients()` (each worker's gradient of its next minibatch at its current model:
  {parameter name: [workers, *shape]}), `learner.sgd_step(grads)` (every worker's
  torch.optim.SGD step with the workload's lr, momentum and weight decay),
  `learner.average_models()` (every model becomes the mean: an all-reduce average),
  `learner.average_groups(groups)` (each group's members take the group's mean: P-Reduce),
  `learner.mix(peers, weights)` (gossip: worker i's model becomes sum over m of
  weights[i, m] * x[peers[i, m]] from the models before the mix, summed in the order of m:
  put the worker's own model first, then its peers in the real step's order; rows of unequal
  length are padded with weight 0; both [workers, m] tensors), `learner.flat()` /
  `learner.set_flat(rows)` ([workers, model size] in flat_params' order).
  `learner.gradients(samples=[...])` gives each worker's gradient over only the first
  samples[w] samples of its minibatch (the micro-batches it computed; the rest dropped), and
  `learner.gradients(samples=[...], stream=True)` over its next samples[w] samples, any
  count, across minibatches (a batch of its own size, as a real worker's Work takes it);
  `learner.mean_by_samples(grads, samples)` their sample-weighted mean on every worker.
  Call them in the real step's order: template.py's LocalSGDSim.learn is the worked example
  (a local step, and every `period`-th the mean).
- An asynchronous protocol (`learns_events = True`) applies one worker's operations at a
  time, in the order its events run: `learner.begin(w)` (w's compute starts: its gradient
  will be of the model it holds now), `learner.gradient(w)`, `learner.worker_step(w,
  grads)`, `learner.row(w)` / `learner.set_row(w, flat)` (one worker's flat model),
  `learner.server_step(grads)` and `learner.take_server(w)` (a parameter server's model and
  a worker taking it), `learner.pair_average(i, j)`; ps.py and adpsgd.py are the examples.

The workload half
- `Workload` (subclass it) and `WorkloadOptions` (its options dataclass's base).
"""

from hetbench.comm.clock import now_ns
from hetbench.comm.comm import Comm, CommMisuse, ReduceOp
from hetbench.core.algorithm import Algorithm, NoOptions, StepInfo
from hetbench.core.context import WorkerContext
from hetbench.core.options import opt
from hetbench.core.tensors import (
    buckets,
    flat_grads,
    flat_params,
    flat_params_numel,
    flat_state,
    params_of,
    set_flat_grads,
    set_flat_params,
    set_flat_state,
)
from hetbench.core.waits import WAIT_RULES, WaitRule
from hetbench.core.work import Work, split_batch
from hetbench.core.workload import Workload, WorkloadOptions
from hetbench.errors import UserError
from hetbench.sim.learn import Learner
from hetbench.sim.protocol import Meetings, MemberCaches, Partners, Protocol, Steps

__all__ = [
    "WAIT_RULES",
    "Algorithm",
    "Comm",
    "CommMisuse",
    "Learner",
    "Meetings",
    "MemberCaches",
    "NoOptions",
    "Partners",
    "Protocol",
    "ReduceOp",
    "StepInfo",
    "Steps",
    "UserError",
    "WaitRule",
    "Work",
    "WorkerContext",
    "Workload",
    "WorkloadOptions",
    "buckets",
    "flat_grads",
    "flat_params",
    "flat_params_numel",
    "flat_state",
    "now_ns",
    "opt",
    "params_of",
    "set_flat_grads",
    "set_flat_params",
    "set_flat_state",
    "split_batch",
]
