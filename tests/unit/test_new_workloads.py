"""The Transformer language model, ResNet-200, VGG-16's forms and the digits as images: sizes,
data sources and what they read."""

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


def test_vgg16_forms_have_their_known_parameter_counts():
    from hetbench.workloads.vgg16 import vgg16

    # torchvision's VGG-16 with a 10-way last layer, and the CIFAR form (13 conv layers with
    # batch norm, one linear classifier), 14.7M as CIFAR-10 training code has it.
    assert count(vgg16("torchvision", 1.0, 10)) == 134_301_514
    assert count(vgg16("cifar-bn", 1.0, 10)) == 14_728_266
    narrow = vgg16("cifar-bn", 0.125, 10)
    convs = [m for m in narrow.features if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [8, 8, 16, 16, 32, 32, 32, 64, 64, 64, 64, 64, 64]
    assert narrow(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(UserError, match="width must be in"):
        RunConfig(algorithm="allreduce", workload="vgg16", workers=2,
                  workload_options={"width": 0})


def test_digits_as_cifar_images_are_the_stratified_digits_split_upscaled():
    from hetbench.core.options import build_config
    from hetbench.workloads.cnn_cifar10 import CNNCifar10
    from hetbench.workloads.data import digits_split

    config = build_config(CNNCifar10.Config, {"dataset": "digits"}, "cnn-cifar10")
    workload = CNNCifar10(config, seed=1)
    x, y, x_test, y_test = workload._data
    flat, labels, _, test_labels = digits_split(0.2)
    assert x.shape == (len(flat), 3, 32, 32) and len(x) + len(x_test) == 1797
    assert torch.equal(y, labels) and torch.equal(y_test, test_labels)
    assert abs(float(x.mean())) < 1e-4 and float(x.std()) == pytest.approx(1, abs=1e-3)
    # Upscaled, not replaced: averaging each 4x4 block gives back the 8x8 digit, up to scale.
    pooled = torch.nn.functional.avg_pool2d(x[:1, :1], 4).flatten()
    assert torch.corrcoef(torch.stack([pooled, flat[0]]))[0, 1] > 0.95
    assert RunConfig(algorithm="allreduce", workload="cnn-cifar10", workers=2,
                     workload_options={"dataset": "digits"}).data_source == (
        "scikit-learn digits, upscaled to 32x32x3")


def test_every_run_says_which_data_it_read(tmp_path):
    def source(workload, **options):
        return RunConfig(algorithm="allreduce", workload=workload, workers=2,
                         workload_options=options).data_source

    assert source("mlp-digits") == "scikit-learn digits"
    assert source("svm") == "synthetic"
    assert source("resnet18", synthetic=True) == "synthetic"
    assert source("resnet18", compute="emulated") == "none (emulated compute)"
    assert source("transformer") == "Python's documentation text (pydoc_data)"
    (tmp_path / "cifar-10-batches-py").mkdir()
    assert source("vgg16", data_dir=str(tmp_path)) == f"CIFAR-10 ({tmp_path})"
    with pytest.raises(UserError, match="contradict each other"):
        source("cnn-cifar10", synthetic=True, dataset="digits")


def test_a_model_state_holds_the_batch_norm_statistics_beside_the_parameters():
    from hetbench.core.tensors import flat_params, flat_state, set_flat_state

    plain = torch.nn.Linear(3, 2)
    assert torch.equal(flat_state(plain), flat_params(plain))
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model(torch.randn(8, 3) * 5 + 2)  # training mode: the running statistics move
    state = flat_state(model)
    assert state.numel() == count(model) + 2 * 4  # running mean and variance, not the counter
    stats = model[1].running_mean.clone(), model[1].running_var.clone()
    model(torch.randn(8, 3))
    with torch.no_grad():
        model[0].weight.add_(1)
    set_flat_state(model, state)
    assert torch.equal(model[1].running_mean, stats[0])
    assert torch.equal(model[1].running_var, stats[1])
    assert torch.equal(flat_state(model), state)
    # A non-persistent buffer (the Transformer's causal mask) is a constant, not state.
    transformer = TransformerLM(*SIZES["tiny"])
    assert torch.equal(flat_state(transformer), flat_params(transformer))
