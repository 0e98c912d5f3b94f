"""A simulated summary has every field a real one has, for every algorithm: the same keys, less
the ones only a real host can measure, which it names as absent (issue 35)."""

import pytest

from hetbench.core.config import RunConfig
from hetbench.core.registry import ALGORITHMS
from hetbench.reports.tables import sync_flag
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import REAL_ONLY, simulate
from tests.helpers import run_config

#: Records of how a simulation was made: no real run has them.
SIM_ONLY = {"simulated", "sim", "sim_s", "events", "absent"}
#: Options that make an algorithm valid at 4 workers where its defaults need more.
OPTIONS = {"prague-random": {"group_size": 2}, "prague-smart": {"group_size": 2}}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS.names()))
def test_simulated_and_real_summaries_have_the_same_fields(tmp_path, algorithm):
    fields = dict(algorithm=algorithm, workload="mlp-digits", workers=4, iterations=12,
                  warmup_iterations=2, pace_ms=5, seed=1,
                  algorithm_options=OPTIONS.get(algorithm, {}))
    real = run_config(tmp_path / "real", **fields)
    assert real["status"] == "ok", real["cause"]
    # Every built-in at its default options, the template included, synchronizes as its
    # protocol intends: the report's warnings section is for defects only (issue 55).
    assert sync_flag(real["sync_share"], real["sync_intended"]) == "", algorithm
    models = SimModels(NetworkModel(alpha_s=20e-6, beta_bytes_per_s=1.25e9), ComputeModel())
    simulated = simulate(RunConfig(**fields), models, tmp_path / "sim").summary
    assert simulated["status"] == "ok"
    assert set(simulated) - SIM_ONLY == set(real) - set(REAL_ONLY)
    assert set(simulated["absent"]) == set(REAL_ONLY) & set(real)
