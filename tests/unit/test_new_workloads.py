"""The Transformer language model and ResNet-200: sizes, text sources and what they read."""

import pytest
import torch

from hetbench.core.config import RunConfig
from hetbench.errors import UserError
from hetbench.workloads.resnet import resnet200
from hetbench.workloads.transformer import (
    SIZES,
    Transformer,
    TransformerLM,
    TransformerOptions,
    parameter_count,
    read_text,
)


def count(model):
    return sum(p.numel() for p in model.parameters())


def test_resnet200_has_the_published_parameter_count():
    # He et al. 2016 (identity mappings): ResNet-200, 64.7M parameters at 1000 classes.
    assert round(count(resnet200(1000)) / 1e6, 1) == 64.7
    # The CIFAR-10 variant only swaps the 1000-way layer for a 10-way one.
    assert count(resnet200(10)) == count(resnet200(1000)) - 2048 * 990 - 990


@pytest.mark.parametrize("size", list(SIZES))
def test_transformer_parameter_count_matches_its_config(size):
    assert count(TransformerLM(*SIZES[size])) == parameter_count(size)


def test_the_paper_size_is_about_60m():
    assert 59e6 < parameter_count("paper") < 62e6


def test_transformer_is_causal():
    torch.manual_seed(0)
    model = TransformerLM(*SIZES["tiny"]).eval()
    x = torch.randint(0, 256, (1, 32))
    changed = x.clone()
    changed[0, 20:] = (changed[0, 20:] + 1) % 256
    with torch.no_grad():
        a, b = model(x), model(changed)
    # Positions before 20 cannot see what changed after them; position 20 onwards can.
    torch.testing.assert_close(a[0, :20], b[0, :20])
    assert not torch.allclose(a[0, 20:], b[0, 20:])


def test_shipped_text_is_pythons_own_docs_and_a_held_out_tenth():
    train, test = read_text("python-docs")
    assert len(train) > 300_000 and 0.09 < len(test) / (len(train) + len(test)) < 0.11
    assert "The" in train and "def " in train  # English prose and code
    assert read_text("python-docs") == (train, test)  # the same on every call


def test_text_from_a_wikitext_directory_and_a_missing_path(tmp_path):
    (tmp_path / "wiki.train.tokens").write_text("= Valkyria = \n the game began " * 50)
    (tmp_path / "wiki.valid.tokens").write_text(" held out text " * 20)
    train, test = read_text(str(tmp_path))
    assert train.startswith("= Valkyria") and test.startswith(" held out")
    with pytest.raises(UserError, match="no text at"):
        RunConfig(algorithm="allreduce", workload="transformer", workers=2,
                  workload_options={"text": str(tmp_path / "missing.txt")})


def test_batches_are_next_byte_pairs_from_each_workers_shard():
    workload = Transformer(TransformerOptions(), seed=1)
    x, y = next(workload.train_batches(1, 2))
    context = SIZES["tiny"][4]
    assert x.shape == y.shape == (16, context)
    torch.testing.assert_close(x[:, 1:], y[:, :-1])  # y is x shifted by one byte
    scores = workload.evaluate(TransformerLM(*SIZES["tiny"]))
    assert scores["test_perplexity"] == pytest.approx(torch.tensor(scores["test_loss"]).exp())


def test_the_size_option_offers_exactly_the_defined_sizes():
    import typing

    hint = typing.get_type_hints(TransformerOptions)["size"]
    assert set(typing.get_args(hint)) == set(SIZES)
