"""How each kind of --plugin spec loads (core/plugins.py), a run's code identity
(core/identity.py), and when a finished run counts as run by the current code (issue 55)."""

import copy
import json
import sys

import pandas as pd
import pytest

from hetbench.core import plugins
from hetbench.core.config import RunConfig
from hetbench.core.identity import code_change, code_identity, source_digest
from hetbench.core.registry import ALGORITHMS, WORKLOADS
from hetbench.errors import UserError
from hetbench.harness.runner import finished_current
from hetbench.reports.notes import metadata

ALGORITHM = '''
import torch

from hetbench.api import Algorithm, StepInfo


class {cls}(Algorithm):
    name = "{name}"
    description = "a test plugin"

    def step(self, ctx, model, optimizer):
        optimizer.step()
        return StepInfo()
'''


@pytest.fixture
def clean_plugins(monkeypatch):
    """Whatever a test loads is forgotten after it: the registries, the loaded specs, sys.path
    and the modules it imported."""
    saved = [(r, copy.copy(r.__dict__)) for r in (ALGORITHMS, WORKLOADS)]
    for registry, state in saved:
        registry.__dict__.update({k: copy.copy(v) for k, v in state.items()})
    monkeypatch.setattr(plugins, "_loaded", {})
    monkeypatch.setattr(sys, "path", list(sys.path))
    # setenv, not delenv: delenv of an absent variable records nothing to restore, and the
    # HETBENCH_PLUGINS that plugins.use() sets would then reach every later test's processes.
    monkeypatch.setenv(plugins.PLUGINS_ENV, "")
    modules = set(sys.modules)
    yield
    for registry, state in saved:
        registry.__dict__.clear()
        registry.__dict__.update(state)
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    source_digest.cache_clear()


def test_each_kind_of_spec_registers_its_classes(tmp_path, clean_plugins, monkeypatch):
    single = tmp_path / "single_algo.py"
    single.write_text(ALGORITHM.format(cls="Single", name="t-single"))
    package = tmp_path / "pkgs" / "t_package"
    package.mkdir(parents=True)
    (package / "impl.py").write_text(ALGORITHM.format(cls="Packaged", name="t-packaged"))
    (package / "__init__.py").write_text("from .impl import Packaged\n")
    target = tmp_path / "target"  # as `pip install --target` leaves it
    (target / "t_target-0.3.dist-info").mkdir(parents=True)
    (target / "t_target.py").write_text(ALGORITHM.format(cls="Targeted", name="t-targeted"))
    (target / "t_target-0.3.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: t-target\nVersion: 0.3\n")
    (target / "t_target-0.3.dist-info" / "entry_points.txt").write_text(
        "[hetbench.algorithms]\nt-targeted = t_target:Targeted\n")
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "t_dotted.py").write_text(ALGORITHM.format(cls="Dotted", name="t-dotted"))
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.chdir(tmp_path)

    assert plugins.use(["single_algo.py", str(package), str(target), "t_dotted"]) == [
        "t-single", "t-packaged", "t-targeted", "t-dotted"]
    assert ALGORITHMS.get("t-single").__module__ == "single_algo"
    assert ALGORITHMS.get("t-packaged").__name__ == "Packaged"
    assert ALGORITHMS.get("t-targeted").__name__ == "Targeted"
    # The ranks read the same specs, paths made absolute.
    assert plugins.specs_from_environment() == [
        str(single), str(package), str(target), "t_dotted"]

    config = RunConfig(algorithm="t-targeted", workload="svm", workers=2, iterations=10)
    identity = code_identity(config)
    assert identity["algorithm"].startswith("t-target 0.3, source ")
    assert identity["workload"].startswith("hetbench ")
    single_id = code_identity(RunConfig(algorithm="t-single", workload="svm", workers=2,
                                        iterations=10))["algorithm"]
    assert single_id == f"source {source_digest('single_algo')}"
    # A package's identity covers every .py file under it.
    before = source_digest("t_package.impl")
    (package / "helpers.py").write_text("X = 1\n")
    source_digest.cache_clear()
    assert source_digest("t_package.impl") != before


def test_plugins_cannot_take_a_built_in_name_and_must_register_something(
        tmp_path, clean_plugins):
    clash = tmp_path / "clash.py"
    clash.write_text(ALGORITHM.format(cls="Clash", name="allreduce"))
    with pytest.raises(UserError, match="'allreduce' is a built-in name"):
        plugins.use([str(clash)])
    nothing = tmp_path / "nothing.py"
    nothing.write_text("from hetbench.api import Algorithm\n")  # imported, not its own
    with pytest.raises(UserError, match="registers no algorithm or workload"):
        plugins.use([str(nothing)])
    with pytest.raises(UserError, match="no such file or directory"):
        plugins.use(["nowhere/x.py"])


def test_runs_recorded_before_identities_stand_for_built_ins_not_plugins():
    builtin = {"algorithm": "hetbench 0.1.0", "workload": "hetbench 0.1.0"}
    plugin = {"algorithm": "my-plugin 0.2, source 0123456789ab", "workload": "hetbench 0.1.0"}
    assert code_change(None, builtin) is None
    assert "cannot be told unchanged" in code_change(None, plugin)
    assert code_change(plugin, plugin) is None
    changed = {**plugin, "algorithm": "my-plugin 0.2, source ba9876543210"}
    assert code_change(plugin, changed) == (
        "its code changed (algorithm my-plugin 0.2, source 0123456789ab -> my-plugin 0.2, "
        "source ba9876543210)")


def test_the_runner_skips_a_finished_built_in_run_recorded_without_an_identity(tmp_path):
    config = RunConfig(algorithm="allreduce", workload="svm", workers=2, iterations=10)
    run_dir = tmp_path / config.run_id
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "ok"}))
    assert finished_current(run_dir, config, force=False) == ({"status": "ok"}, None)
    assert finished_current(run_dir, config, force=True) == (None, "--force")
    stale = {"status": "ok", "code": {**code_identity(config), "algorithm": "hetbench 0.0.1"}}
    (run_dir / "summary.json").write_text(json.dumps(stale))
    summary, why = finished_current(run_dir, config, force=False)
    assert summary is None and why.startswith("its code changed (algorithm hetbench 0.0.1 ->")


def test_the_metadata_table_names_each_runs_code(tmp_path):
    runs = pd.DataFrame([
        {"run_id": "a", "status": "ok", "run_dir": str(tmp_path),
         "code": {"algorithm": "hetbench 0.1.0", "workload": "hetbench 0.1.0"}},
        {"run_id": "b", "status": "ok", "run_dir": str(tmp_path),
         "code": {"algorithm": "source 0123456789ab", "workload": "hetbench 0.1.0"}},
        {"run_id": "c", "status": "ok", "run_dir": str(tmp_path), "code": None},
    ])
    assert list(metadata(runs)["code"]) == [
        "hetbench 0.1.0", "algorithm: source 0123456789ab; workload: hetbench 0.1.0", ""]
