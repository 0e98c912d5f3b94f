"""hetbench's public plugin API, and the contract an algorithm follows.

    from hetbench.api import Algorithm, StepInfo, opt, UserError, flat_params, set_flat_params

This docstring is the one complete statement of the contract. hetbench/algorithms/template.py
is a worked example of it (local SGD, every half), docs/plugins.md a walk-through (a plugin
written from it, loaded with `--plugin`, shipped as an entry point), and each class's own
docstrings (`help(Algorithm)`, `help(StepInfo)`, `help(Comm)`, `help(Protocol)`,
`help(Learner)`, `help(Work)`) detail its members.

Stability
- Every name in `__all__` keeps working across releases; a rename keeps the old name
  importable for one release, with a warning that names the new import. Every other module of
  hetbench is internal and may move (the paths of release 0.1's first plugins,
  `hetbench.algorithms.base`, `hetbench.harness.options`, `hetbench.harness.tensors` and
  `hetbench.harness.context` still import, with such a warning, until the next release).

One algorithm, one module
- One module (or small package) holds all of an algorithm: its options, its decision rules,
  the real half (`bench run`) and, optionally, the simulated half (`bench sim`) and the
  learning half (`bench sim --learn`).
- Decision rules (whom to wait for, which group, when to skip) are pure functions that both
  halves call, so the simulation plays the real rules (hop.py's queue rules,
  prague/generator.py). Randomness comes from the run's seeds: `ctx.rng` (seeded per rank) in
  the real half, the same seeds in the simulated one.

How the harness runs an algorithm
- Before any process starts: each option is checked against its field's annotation and
  `validate(config, workers)` runs; a bad value is one line and exit code 2.
- The launcher enters `services(run, run_dir)` (a classmethod context manager: processes the
  run needs beside its ranks, such as Prague's Group Generator) before starting any rank and
  leaves it after the last one ended; what it yields reaches every rank as `ctx.services`.
- Every rank, one instance each: `setup(ctx, model, optimizer)`, before the clock starts.
  Then each worker loops: `compute` (forward and backward) -> the pace floor and the injected
  slowdown -> `step` -> one event line. An algorithm never reads the slowdown: it sees its
  own compute time as it goes (`work.elapsed_s`), as a slow GPU's worker would. After its
  budget each worker calls `finish(ctx, model)`, then the final evaluation. Server ranks
  (`server_ranks(config, workers)` of them, after the workers) run `serve(ctx, model,
  optimizer)` instead of the loop: it returns when every worker is done, with what the server
  records in its done.rank<r>.json.

The class: `Algorithm` (subclass it)
- `name` (the registry name; a plugin's must not be a built-in's), `description` (one line
  for `bench list`), `Config`: a frozen kw_only dataclass whose fields are `opt(default,
  doc)` (`bench list` shows each with its default and doc; `[algorithm.<name>]` in a matrix
  sets it), or `NoOptions`. Each value is type-checked against the field's annotation (int,
  float, bool, str, Literal[...], unions of them); `validate` is for the rest (raise
  `UserError`, one line).
- `synchronous`: True (the default) only when every worker runs the same collective at every
  iteration in the same order; a `seconds` budget is then agreed by a collective each
  iteration, so no worker leaves while its peers still wait for it. Pairs, groups formed on
  the fly, servers and serving threads set it False, and drain in `finish` what peers may
  still ask.
- `intended_sync_share(config, workers)`: the share of iterations in which the protocol means
  a worker to average with at least one peer (default 1.0). A report flags a run that falls
  markedly below it (a throughput win bought by synchronizing less) or an algorithm whose
  steps do not say whom they averaged with.
- How the reports attribute its waits ("who waited for whom"): `wait_rule`, a class attribute
  (or a classmethod of (options, workers)) naming one of `WAIT_RULES` ("all", "neighbours",
  "from", "group", "peer", "server", "quorum", "named"; the dict says what each reads from
  the log and how it attributes), or a `WaitRule` of the plugin's own (a function from the
  event logs to (worker, iteration, waited on, seconds)). Undeclared, the reports infer one
  from the fields the steps log. summary.json records it, so reports need not import the
  algorithm.
- The algorithm's own facts in the report: `summary_facts(config, events, done)` (a
  classmethod: counts from every worker's event lines, StepInfo.fields included, in real and
  simulated runs; `done` is None per rank without a record, as in a simulated run) and
  `fact_units` ({fact name: its unit}). summary.json holds them, and `bench report` shows
  them in a table per algorithm and as `fact:<name>` columns of report.csv.
- Which model the evaluation scores (accuracy at each snapshot, at the end, time to target;
  summary.json's `evaluated_model`): `evaluated_model`, a class attribute. "workers" (the
  default): the workers' average. "server": the first server rank's model, which its
  `serve()` reports after each update by calling `ctx.model_updated()` (after the update's
  replies are sent: the harness then reads a clock, and copies the model at each snapshot
  tick, or after every update when the run has a target). Any other value names a model each
  worker holds beside the one it trains (DiLoCo's "outer model"): `evaluated_state(model)`
  returns it on a worker, flat as `flat_state(model)` lays out the model (buffers
  included), and the workers' average of it is scored. The consensus distance is always the
  workers' own models'.
- Refusals a config may need, each a classmethod returning why (one line) or None:
  `needs_real_compute(config)` (an option acting inside backward cannot run under emulated
  compute), `outside_comm(config)` (it communicates outside Comm, through DDP or Horovod, so
  a `[network]` model could not shape it), `one_host_only(config)` (refused with `--hosts`).
  `optional_features()` names options that need a separately installed back-end, for `bench
  list`.
- `simulated_protocol()`: the class of its simulated half (below), or None: `bench sim` then
  refuses the algorithm with one line; `bench run` does not need it.

The real half (`bench run`)
- `setup(ctx, model, optimizer)` runs on every rank before training: fixed groups
  (`ctx.comm.group(members)`, collective over the world) and channels are made here.
  `ctx` is a `WorkerContext`: rank, world_size, workers, worker_ranks, device, seed, rng,
  `comm`, services, dilation (host seconds per second of the run's time: divide a duration
  measured on this host's clock by it).
- The work of a step: `compute(ctx, model, work)`, called before `step`. Not overridden, the
  harness runs one batch itself (as fast as a plain loop). An algorithm that changes how much
  a worker computes (DropCompute, a batch balancer) overrides it and takes micro-batches from
  `work` (a `Work`): `work.compute(n)` (forward and backward over the next n samples, their
  gradient added), `work.skip(n)` (drop n samples uncomputed), `work.elapsed_s` (this
  iteration's compute so far: its own clock; on a GPU reading it waits for the queued
  micro-batches, so read it where a decision needs it), `work.samples`,
  `work.micro_batches`, `work.batch_size`. The pace floor and the injected slowdown apply
  per micro-batch, in proportion to its samples, so cutting work cuts the delay; `p.grad` is
  then the mean over the samples used, and the step's event counts them (`StepInfo.samples`
  may say otherwise): throughput counts samples computed, not drawn. Under emulated compute a
  micro-batch is a paced wait of its share of compute_ms. `split_batch(batch, m)` gives the
  micro-batch sizes every half uses. algorithms/dropcompute.py is the worked example (all
  three halves).
- `forward_module(model)`: the module forward and backward run through (an algorithm that
  synchronizes inside backward, as torch DDP does, returns its wrapper; it calls
  `ctx.end_compute()` before that communication starts, so waiting is never timed as
  compute).
- `step(ctx, model, optimizer)`: gradients are in `p.grad`; apply the local update and
  synchronize through `ctx.comm` (never torch.distributed directly), and return a `StepInfo`:
  `peers` (how many other workers' models or gradients went into this update; 0 for a local
  step) and `staleness` (their mean age in iterations; ps-async counts server updates):
  reports show them as synchronization health beside throughput. No timing code: Comm
  records the ranks each step's operations met (the event's `peer_ranks`) and how long its
  point-to-point operations blocked (its `wait_s`), and the reports infer a collective's wait
  from every member's arrival. Set `wait_s` only for waits Comm does not see (a condition a
  receiving thread fills), `peer_ranks` where the ranks met are not the ranks synchronized
  with, `waited_on` ({rank: seconds}) where the step knows whose message ended each wait.
  Also: `next_iteration` (jumping ahead, as Hop's skips), `discarded` (the gradient was
  thrown away: its samples count toward no throughput), `samples`, and `fields` (the event
  line's extra fields: group members, neighbours used; `samples` among them sets the samples
  used; a key the harness writes itself is refused; a field named `*_s` is seconds on this
  host, recorded in cluster time).
- Which Comm primitive for which pattern (`help(Comm)` says the same):
  every worker together, `all_reduce_`, `average_`, `broadcast_`, `barrier` with
  `members=ctx.worker_ranks` (None: the whole world, server ranks included); fixed groups,
  `ctx.comm.group(members)` in `setup()` on every rank in the same order, then `members=`;
  groups formed on the fly by their members alone (a new partner each step),
  `ctx.comm.p_reduce_(t, members)` or `average_(t, members=...)`; any other collective over
  a set that had no group at setup is refused at once (`CommMisuse`: it could only hang).
  Point to point: `send`/`recv`/`isend`/`irecv` (a receive from any sender with src=None, on
  gloo), or a `channel(name)` made in `setup()` for a serving thread, used through the `*_on`
  forms; a serving thread that must read a message's header before it knows what the
  message is uses `recv_head_on` (the header comes from host memory: on a shared GPU,
  reading it off the device waits for the rank's queued compute). `rpc(peer, call)` is a
  request to a service on a peer's node. Every isend's work is waited: `wait()` where the
  protocol waits for it, or `let_go()` where it never does (gloo lets a sent message go only
  then). Tags 71, 72 and 73 on the world group are the harness's (the time-to-target search,
  a staged message's speed, the clocks' exchanges), before and after training: use others.
  Every call is bounded by the run's timeout: a dead peer is an exception, not a hang.
- `finish(ctx, model)`, on every worker after its budget is spent: asynchronous algorithms
  drain here (answer peers' pending requests until all are done) and return what the drain
  did for done.rank<r>.json; every averaging must be on record, so count those after the
  last iteration as {"averagings_after_training": n}.
- `now_ns()`: the run's clock (nanoseconds), rank 0's on every rank: a time a step logs that
  another rank's is compared with (an arrival, a skip) must be read from it, not from
  time.time_ns(), whose hosts' clocks differ across machines.
- Tensor helpers: params_of, flat_params, set_flat_params, flat_grads, set_flat_grads,
  flat_state, set_flat_state, flat_params_numel, buckets.

The simulated half (`bench sim`)
- `Protocol` (subclass it; `simulated_protocol()` returns the class). A protocol may read
  (times in simulated seconds): `self.n` (workers), `self.config` (the algorithm's options),
  `self.model_bytes`; `self.engine.now` (the current event's time), `.iteration[w]` (w's
  step counter), `.t_sync[w]` (when w's current gradient was ready), `.t_start[w]`,
  `.active` (processes in a step or a server loop now: pass it to the costs).
- The costs, `self.net`: `ring(members, nbytes, at, active)` (when a ring all-reduce
  starting at `at` ends), `rings(members, sizes, at, active)` (buckets in turn),
  `exchange(x, neighbours, nbytes, at, active)` (worker x's exchange with each neighbour,
  both ways), `exchange_s(degree, nbytes, active)` (its duration, for a lockstep path),
  `message_to(src, dst, nbytes, at, active)` (when a message arrives, its CPU time included),
  `wire(src, dst, nbytes, at)` (without it), `p_reduce(nbytes, members, active)` (a
  P-Reduce's duration), `rpc_one_way(w)` (to a service on rank 0's node), `group_setup_s` (a
  P-Reduce communicator's set-up, `[network] group_setup_ms`, paid on a member-set cache
  miss); on a lockstep path `ring_allreduce(nbytes, n, active)` and `message(nbytes,
  active)` too. The same calls answer from an alpha-beta model or a `[network]` cluster's
  links and NIC queues (`self.net.cluster` is then set). The default costs are a generic
  machine's: `bench sim --fit-from RESULTS` fits them to real runs, `--against RESULTS`
  shows each cell's error.
- The event path: the engine calls `ready(w)` when worker w's gradient is ready (at
  `self.engine.now`) and `finish(w, t)` when w's budget is spent (the default calls
  `self.engine.done(w)`, as a protocol must once w's real finish() would return). The
  protocol calls `self.engine.end_step(w, t_end, wait_s, fields=None, next_iteration=None,
  *, peers, staleness, discarded, peer_ranks)` when the real step would end, with what its
  StepInfo would say (t_end >= now and >= t_sync[w]: an earlier end, or a field the harness
  writes itself, is refused in one line naming the protocol; formatting `fields` may be
  skipped where `self.engine.full_events` is False), and `self.engine.at(t, fn, *args)` to
  run fn at simulated time t. Events run in time order.
- `lockstep = True` with `step_all(k, t_sync, full)` (returning `Steps`: t_end and wait_s
  arrays, peers, staleness, and with `full` the fields and peer_ranks, one per worker) lets
  the engine play every worker's k-th step at once, far faster at thousands of workers. It
  is allowed only when worker w's k-th step ends at a time the k-th gradients alone decide,
  whatever order events run in: costs that depend on what else happens at that instant (a
  NIC queue other messages are in, a count of active processes that varies) or on the order
  of arrivals (pairs formed by who comes first) rule it out. The event path stays the
  reference: both must give identical results (tests/unit/test_sim_lockstep.py).
- Synchronous patterns: a synchronous algorithm declares who meets whom at iteration k and
  inherits the event path, the lockstep path and the fair transport's flows. `Collective`:
  `sizes(k)`, the ring all-reduces over every worker at iteration k in bytes, or None for a
  local step (template.py's LocalSGDSim, allreduce, diloco). `GroupAverage`: `groups(k)`,
  iteration k's partition of the workers, each group of two or more meeting in a P-Reduce
  (prague-static). `NeighbourExchange`:
  `make_exchange()`, the real step's graph (`links(rank, k)`, `at(rank, k)` with the mixing
  row, `rounds`, `time_varying`, and `graph` or `shifts(k)`; dpsgd.py's Exchange), each step
  waiting for its neighbours' k-th models; `self.mixing(k)` gives `learner.mix` its rows
  (dpsgd, sgp). The math stays in `learn`.
- Helpers: `Partners` (the event path of a step k that waits for given partners' k-th
  gradients: neighbours, or everyone at an averaging step), `Meetings` (P-Reduce groups
  meeting on the fly; set `self.meetings` for its cache counters in the summary) and
  `MemberCaches` (which member sets would hold a cached communicator: a miss pays
  `self.net.group_setup_s`).
- The fair transport (`[network] transport = "fair"`): a protocol plays it only when it sets
  `transport_ready = True`, runs its collectives through `self.after_rings(members, sizes,
  at, then, *args)` and sends every point-to-point message and posts every receive where its
  real half does through `self.transport` (network/transport.py; a receive from any sender
  passes `ANY`); otherwise `bench sim` refuses it under fair.
- A protocol whose algorithm owns its compute sets `work(w, k, compute_s, factor)`: how much
  worker w computes in iteration k given a whole batch's compute time and its slowdown
  factor, returning (compute_s, slowdown_s, samples), decided by the same pure rule as the
  real half over the same per-micro-batch durations (compute_s * size / batch * factor). The
  engine times the gradient and counts the samples by it.
- Server ranks: a protocol with `servers = 1` (a parameter server) has that many server
  processes always competing for the CPU (`self.engine.active` counts them); the server's
  own CPU time per message is `self.net.cpu_s` times `self.net.share(active)` (processor
  sharing over the cores), and a message's wire time `self.net.wire(src, dst, nbytes, at)`
  or `self.net.message_to(...)` (CPU included). ps.py's PSSyncSim and PSAsyncSim are the
  worked examples: a server that takes one push at a time keeps a `server_free` time.

The learning half (`bench sim --learn`)
- A protocol without one (`learn` None and `learns_events` False) is refused by `--learn`
  in one line.
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
  time, in the order its events run, on `self.engine.learner`: `learner.begin(w)` (w's
  compute starts: its gradient will be of the model it holds now), `learner.gradient(w)`,
  `learner.worker_step(w, grads)`, `learner.row(w)` / `learner.set_row(w, flat)` (one
  worker's flat model), `learner.server_step(grads)` and `learner.take_server(w)` (a
  parameter server's model and a worker taking it), `learner.pair_average(i, j)`; ps.py and
  adpsgd.py are the examples.
- `learn_finish(learner, iterations)`: the model operations the real workers' finish() does
  after training (SGP mixes in the messages still in flight), applied once the steps are
  over.
- The evaluated model: a protocol whose algorithm declares another `evaluated_model` sets
  `learner.server` (or `learner.evaluated_flat`, flat_params' order) to it.
- Following a real run: `recorded_order(logs, done)`, a classmethod, reads the real order of
  the protocol's order-dependent events from a real run's event logs and done records, and
  the protocol follows `self.engine.recorded_order` when it is set: `bench sim --against
  RESULTS --learn` then shows whether its learned math ends with the real runs' models
  (sim/recorded.py; ps.py's PSAsyncSim is the shortest example). None: the record does not
  determine the order. Lockstep protocols need none.

The workload half
- `Workload` (subclass it) and `WorkloadOptions` (its options dataclass's base), registered
  under the `hetbench.workloads` entry point as algorithms are under `hetbench.algorithms`.
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
from hetbench.network.transport import ANY
from hetbench.sim.learn import Learner
from hetbench.sim.protocol import Meetings, MemberCaches, Partners, Protocol, SimEngine, Steps
from hetbench.sim.synchronous import Collective, GroupAverage, NeighbourExchange

__all__ = [
    "ANY",
    "WAIT_RULES",
    "Algorithm",
    "Collective",
    "Comm",
    "CommMisuse",
    "GroupAverage",
    "Learner",
    "Meetings",
    "MemberCaches",
    "NeighbourExchange",
    "NoOptions",
    "Partners",
    "Protocol",
    "ReduceOp",
    "SimEngine",
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
