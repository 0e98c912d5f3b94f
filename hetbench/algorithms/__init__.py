"""Algorithm registry. Built-ins are named here by module path and imported on first use."""

from hetbench.harness.registry import Registry

ALGORITHMS: Registry = Registry("algorithm", "hetbench.algorithms", {
    "allreduce": "hetbench.algorithms.allreduce:AllReduce",
    "ps-sync": "hetbench.algorithms.ps:ParameterServerSync",
    "ps-async": "hetbench.algorithms.ps:ParameterServerAsync",
    "dpsgd": "hetbench.algorithms.dpsgd:DPSGD",
    "adpsgd": "hetbench.algorithms.adpsgd:ADPSGD",
    "hop": "hetbench.algorithms.hop:Hop",
    "prague-static": "hetbench.algorithms.prague.static:PragueStatic",
    "prague-smart": "hetbench.algorithms.prague.smart:PragueSmart",
    "prague-random": "hetbench.algorithms.prague.random:PragueRandom",
    # The template to copy when adding an algorithm (a real one: local SGD).
    "local-sgd": "hetbench.algorithms.template:LocalSGD",
})
