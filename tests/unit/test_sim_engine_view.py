"""A simulated protocol sees the engine through sim.protocol.SimEngine (issue 59): the engine
has every member the view names, and the protocol module no longer imports the engine (the
type-only circle engine.py <-> protocol.py is gone)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from hetbench.core.config import RunConfig
from hetbench.sim import protocol
from hetbench.sim.engine import Engine
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.protocol import SimEngine


def test_the_engine_has_what_the_protocols_view_of_it_names():
    config = RunConfig(algorithm="hop", workload="mlp-digits", workers=4, iterations=10,
                       pace_ms=20)
    network = NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8)
    engine = Engine(config, SimModels(network, ComputeModel()))
    members = set(SimEngine.__annotations__) | {
        name for name, _ in inspect.getmembers(SimEngine, inspect.isfunction)
        if not name.startswith("_")}
    assert members >= {"now", "at", "end_step", "done", "iteration", "learner"}
    missing = [name for name in sorted(members) if not hasattr(engine, name)]
    assert not missing, missing
    for name in ("at", "end_step", "done"):
        assert (list(inspect.signature(getattr(SimEngine, name)).parameters)[1:]
                == list(inspect.signature(getattr(engine, name)).parameters)), name


def test_the_protocol_module_does_not_import_the_engine():
    tree = ast.parse(Path(protocol.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "hetbench.sim.engine" not in imported
