"""The contracts every other layer builds on: RunConfig and option building, the registries,
the Algorithm and Workload interfaces, the worker context, the run record (events, done,
summary) and its atomic store, the termination signals. Imports only hetbench.errors,
hetbench.slowdown and hetbench.comm (see docs/architecture.md)."""
