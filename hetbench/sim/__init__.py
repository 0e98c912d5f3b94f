"""A discrete-event simulator of hetbench's synchronization protocols, for scale beyond one machine.

`hetbench.sim.run.simulate(config, models, out_dir)` plays one RunConfig forward in simulated
time: every worker computes for the compute model's time (times the slowdown injector's factor,
as a real run sleeps), then runs its algorithm's synchronization step, whose waits follow the
same protocol rules as the real algorithm and whose messages cost alpha + bytes/beta. Group and
neighbour choices come from the same pure code the real algorithms call (topologies, the static
schedule, the Group Generator). The run directory it writes has the real schema (config.json,
env.json, events.rank<r>.jsonl, summary.json with "simulated": true), so `bench report` and
`bench compare` read it like a measured run.

Modules: model.py (compute and network cost models, fitting), engine.py (event loop, worker
loop), run.py (a simulated run's directory and summary), protocol.py (the contract of a
simulated protocol, and P-Reduce meetings), validate.py (`--against`). Each algorithm's
simulated protocol lives in the algorithm's module, beside its real step; the CLI is
hetbench/cli/sim.py.
"""
