"""compute_preset: an emulated run's compute_ms from a table measured on a named GPU."""

import pytest

from hetbench.core.compute_presets import PRESETS
from hetbench.core.config import RunConfig
from hetbench.errors import UserError


def _config(workload="resnet50", **options):
    return RunConfig(algorithm="allreduce", workload=workload, workers=2, iterations=8,
                     warmup_iterations=2,
                     workload_options={"compute": "emulated", "compute_preset": "h200",
                                       **options})


def test_the_preset_sets_compute_ms_for_the_workload_and_batch_size():
    config = _config(batch_size=64)
    assert config.workload_options["compute_ms"] == PRESETS["h200"]["ms"][("resnet50", 64)]
    assert _config(batch_size=128).workload_options["compute_ms"] > config.workload_options[
        "compute_ms"]
    # A config read back from config.json (the worker's way) holds the same figure.
    again = RunConfig.from_dict(config.to_dict())
    assert again.workload_options == config.workload_options
    assert again.run_id == config.run_id


def test_a_run_with_a_preset_is_not_the_run_with_the_default_compute_ms():
    plain = RunConfig(algorithm="allreduce", workload="resnet50", workers=2, iterations=8,
                      warmup_iterations=2, workload_options={"compute": "emulated",
                                                             "batch_size": 64})
    assert plain.run_id != _config(batch_size=64).run_id


@pytest.mark.parametrize("options, message", [
    ({"batch_size": 48}, "no figure for resnet50 at batch_size 48; it has batch_size 32, 64"),
    ({"batch_size": 64, "compute_ms": 5.0}, "disagree"),
    ({"batch_size": 64, "compute": "real"}, "needs compute = \"emulated\""),
    ({"batch_size": 64, "compute_preset": "a100"}, "unknown; known: h200"),
])
def test_bad_preset_options_are_one_clear_error(options, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        _config(**options)


def test_a_figure_applies_only_to_the_model_it_was_measured_on():
    with pytest.raises(UserError, match="size = 'paper'"):
        _config("transformer", batch_size=16)  # the workload's default size is tiny
    config = _config("transformer", batch_size=16, size="paper")
    assert config.workload_options["compute_ms"] == PRESETS["h200"]["ms"][("transformer", 16)]
    with pytest.raises(UserError, match="no figure for mlp-digits"):
        _config("mlp-digits", batch_size=32)
