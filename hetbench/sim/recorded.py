"""Learning along a real run's recorded order of events (the learning simulator's proof).

A lockstep protocol's order of events is fixed by its iterations, so a learned simulation of a
real run's config applies the real run's steps to the same minibatches in the same order, and
ends with its models (tests/distributed/test_learn.py). An asynchronous protocol applies its
operations in the order its events run, which in a simulation is the simulated timeline's, not
the real run's: the two runs learn from different orders, and differ.

Where a protocol's event log determines the real order, its `Protocol.recorded_order(logs)`
reads it, and the protocol follows that order when the engine is given it. The simulation then
applies the real run's operations in the real run's order; its times are the model's, not the
run's (a request may wait for its turn), and its models equal the real run's (tested). That
separates the math, which must be equal, from the order, which a simulated timeline predicts.

What the built-ins' records determine:

- ps-async: exactly. Each reply carries the server's update count, so step k of worker w
  was update v(w, k) = v(w, k - 1) + 1 + its logged staleness, and its gradient was of the
  model of update v(w, k - 1), the one w pulled.
- allreduce-backup: exactly. Each step logs the update it belongs to (`version`) and whether
  its gradient was dropped; every update averages the gradients of its first n - b arrivals.
- prague-smart and prague-random: exactly. Each step logs its group and the group's id; a
  worker's model changes only in its own steps (its update, then the group's mean), so what
  decides its models is the sequence of groups each worker met: its steps' groups, then the
  groups it drained in finish(), which only the other members logged (in id order, the
  generator's queue order; the done records' counts check that none is missing).
- adpsgd, hop and osgp: not from their logs. An AD-PSGD pair average happens on the passive
  worker's serving thread while that worker computes, and its instant is not logged, so which
  of the passive's gradients saw it is unknown; Hop and OSGP log which neighbour iterations a
  step waited for, not which queued or late messages it mixed. Those are checked against
  exact references instead (a single process's reading of the same rules, and the special
  cases that reduce them to lockstep protocols: tests/distributed/test_learn.py).
"""

from __future__ import annotations

from pathlib import Path

from hetbench.core.config import RunConfig
from hetbench.core.record import read_events
from hetbench.core.rundir import RunDir
from hetbench.core.store import read_json
from hetbench.errors import UserError
from hetbench.sim.engine import simulated_protocol
from hetbench.sim.model import SimModels
from hetbench.sim.run import SimResult, simulate


def recorded_order(real_run_dir: Path, config: RunConfig):
    """The order the real run in `real_run_dir` applied its protocol's order-dependent
    events in, read from its workers' event logs by the protocol; UserError (one line) when
    its record does not determine it."""
    protocol = simulated_protocol(config)
    if protocol.lockstep:
        return None  # the iterations fix the order
    if protocol.recorded_order is None:
        raise UserError(f"{config.algorithm}: a real run's event log does not determine its "
                        "order of events (sim/recorded.py says why), so it cannot be "
                        "followed")
    logs = {w: read_events(Path(real_run_dir), w)[0]  # on rank 0's clock
            for w in range(config.workers)}
    done = {w: read_json(RunDir(real_run_dir).done(w))
            for w in range(config.workers)}
    try:
        return protocol.recorded_order(logs, done)
    except (KeyError, ValueError) as exc:
        raise UserError(f"{real_run_dir}: its event logs do not hold {config.algorithm}'s "
                        f"order of events ({exc})") from None


def learn_along(real_run_dir: Path, models: SimModels, out_dir: Path,
                events: str = "auto") -> SimResult:
    """Simulate the real run in `real_run_dir` with learning (its own config: workload, seed,
    options), its order-dependent events in the real run's order."""
    real_run_dir = Path(real_run_dir)
    summary = read_json(RunDir(real_run_dir).summary)
    if summary.get("status") != "ok":
        raise UserError(f"{real_run_dir}: not a finished run (status "
                        f"{summary.get('status')!r}), so its record is not whole")
    config = RunConfig.from_dict({**read_json(RunDir(real_run_dir).config), "learn": True})
    return simulate(config, models, out_dir, events=events,
                    recorded_order=recorded_order(real_run_dir, config))
