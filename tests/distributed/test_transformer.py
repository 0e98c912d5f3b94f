"""The Transformer language model trains on real processes, on the text that ships offline."""

import json

from tests.helpers import run_config


def test_transformer_test_loss_falls_by_a_tenth_within_150_iterations(tmp_path):
    summary = run_config(tmp_path, algorithm="allreduce", workload="transformer", workers=2,
                         iterations=150, warmup_iterations=5, seed=1)
    assert summary["status"] == "ok", summary["cause"]
    records = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    first = next(r for r in records if r["kind"] == "snapshot" and r["wall_s"] == 0)
    final = next(r for r in records if r["kind"] == "final")
    # Untrained, a byte model is near-uniform over 256 values (ln 256 = 5.55 nats).
    assert first["test_loss"] > 5.0
    assert final["test_loss"] < 0.9 * first["test_loss"], (first["test_loss"], final["test_loss"])
    assert final["test_perplexity"] < first["test_perplexity"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["workload_options"]["text"] == "python-docs"  # the run says which text
