"""hetbench's public plugin API: what a plugin algorithm or workload imports, and nothing else.

    from hetbench.api import Algorithm, StepInfo, opt, UserError, flat_params, set_flat_params

Every name in `__all__` keeps working across releases; a rename keeps the old name importable
for one release, with a warning that names the new import. Every other module of hetbench is
internal and may move (the previous round's `hetbench.algorithms.base`,
`hetbench.harness.options`, `hetbench.harness.tensors` and `hetbench.harness.context` still
import, with such a warning, until the next release).

The real half of an algorithm
- `Algorithm` (subclass it), `StepInfo` (what `step` returns), `NoOptions`, `opt` (an option
  with its default and the doc `bench list` shows), `WorkerContext` (`ctx`: rank, workers,
  device, seeded rng, `comm`), `UserError` (bad options: one line, exit code 2).
- `Comm` (`ctx.comm`): all_reduce_, average_, broadcast_, barrier, group (fixed groups, made in
  setup), p_reduce_ (groups formed on the fly), send/recv/isend/irecv, channel and the *_on
  forms, rpc; `ReduceOp`; `CommMisuse` (an operation that could only hang, refused).
- How the reports attribute its waits ("who waited for whom"): `wait_rule`, a class attribute
  (or a classmethod of (options, workers)) naming one of `WAIT_RULES` ("all", "neighbours",
  "from", "group", "peer", "server", "quorum", "named"; the dict says what each reads from
  the log and how it attributes), or a `WaitRule` of the plugin's own. Undeclared, the
  reports infer one from the fields the steps log.
- Tensor helpers: params_of, flat_params, set_flat_params, flat_grads, set_flat_grads,
  flat_state, set_flat_state, flat_params_numel, buckets.

The simulated half (`bench sim`)
- `Protocol` (subclass it; `simulated_protocol()` returns the class), `Steps` (what a lockstep
  `step_all` returns), `Meetings` (P-Reduce groups meeting on the fly) and `MemberCaches`
  (which member sets would hold a cached communicator: a miss pays the set-up).
- Costs come from `self.net`, times in simulated seconds: `self.net.ring(members, nbytes, at,
  active)` (when a ring all-reduce over `members` that starts at `at` ends), `rings(members,
  sizes, at, active)` (buckets one after another), `message_to(src, dst, nbytes, at, active)`
  (when a point-to-point message sent at `at` arrives, its CPU time included), `wire(src, dst,
  nbytes, at)` (the same without CPU time), `rpc_one_way(w)` (worker w to a service on rank 0's
  node), and `self.net.p_reduce(nbytes, members, active)` (a P-Reduce's duration). `active` is
  how many processes share the host's cores at that moment (`self.engine.active`): without a
  `[network]` table the default model charges each message CPU time shared among them.
  `self.model_bytes` is the model's size; a P-Reduce's first use of a member set costs
  `[network] group_setup_ms` more (MemberCaches says which uses miss).

The workload half
- `Workload` (subclass it) and `WorkloadOptions` (its options dataclass's base).
"""

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
from hetbench.core.workload import Workload, WorkloadOptions
from hetbench.errors import UserError
from hetbench.sim.protocol import Meetings, MemberCaches, Protocol, Steps

__all__ = [
    "WAIT_RULES",
    "Algorithm",
    "Comm",
    "CommMisuse",
    "Meetings",
    "MemberCaches",
    "NoOptions",
    "Protocol",
    "ReduceOp",
    "StepInfo",
    "Steps",
    "UserError",
    "WaitRule",
    "WorkerContext",
    "Workload",
    "WorkloadOptions",
    "buckets",
    "flat_grads",
    "flat_params",
    "flat_params_numel",
    "flat_state",
    "opt",
    "params_of",
    "set_flat_grads",
    "set_flat_params",
    "set_flat_state",
]
