"""A decoder-only Transformer language model on real text: the Prague slides' Transformer row.

Tokens are bytes (so any text works without a tokenizer to download), the loss is next-token
cross-entropy, and evaluations report perplexity (exp of the test loss) and next-token accuracy
beside it (so `target = "accuracy:V"` and `"loss:V"` both work).

Text (option `text`), nothing downloaded at run time:
- "python-docs" (default): the topic help that ships with Python itself (pydoc_data.topics,
  about 0.46 MB of English prose and code; real text, not synthetic);
- a path to a plain-text file, or to a directory holding WikiText's released files
  (wiki.train.tokens and wiki.valid.tokens, or their .raw forms) or any *.txt files (the
  News-Commentary release, say); the last tenth is held out unless a validation file exists.
config.json records which text a run used, and the workload's description says so.

Sizes (option `size`):
- "tiny" and "small": real compute on a CPU core (0.1M and 0.8M parameters);
- "paper": d_model 512, 8 heads, feed-forward 2048 (Transformer-base's widths), 12 layers and a
  44,000-entry vocabulary: 60.5M parameters, the "about 60M" of the Prague slides' Transformer
  (an encoder-decoder the same size; a decoder-only model reaches it with depth and vocabulary).
  Meant for `compute = "emulated"`: real message sizes, paced compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from hetbench.core.options import opt
from hetbench.core.workload import Workload, WorkloadOptions
from hetbench.errors import UserError

#: (d_model, heads, layers, feed-forward, context, vocabulary) of each size.
SIZES = {
    "tiny": (64, 4, 2, 256, 64, 256),
    "small": (128, 4, 4, 512, 128, 256),
    "paper": (512, 8, 12, 2048, 256, 44_000),
}
PYTHON_DOCS = "python-docs"
#: Held-out windows scored at each evaluation (fixed, evenly spaced over the test text).
TEST_WINDOWS = 64


@dataclass(frozen=True, kw_only=True)
class TransformerOptions(WorkloadOptions):
    lr: float = opt(0.1, "SGD learning rate")
    momentum: float = opt(0.9, "SGD momentum")
    batch_size: int = opt(16, "sequences per worker per iteration")
    # The Literal is checked when options are read (core.options); it names SIZES' keys.
    size: Literal["tiny", "small", "paper"] = opt(
        "tiny", "tiny / small: real compute on CPU; paper: the slides' ~60M parameters")
    text: str = opt(PYTHON_DOCS, "python-docs (Python's own topic help, shipped) or a path to "
                                 "a text file or a WikiText / *.txt directory")


class TransformerLM(nn.Module):
    """Token and position embeddings, pre-norm causal self-attention blocks, a final norm and
    an output layer tied to the token embedding."""

    def __init__(self, d_model: int, heads: int, layers: int, ffn: int, context: int,
                 vocab: int):
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(context, d_model)
        block = nn.TransformerEncoderLayer(d_model, heads, ffn, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        # GPT-2's initialisation of the embeddings: with the output tied to them, N(0, 1) would
        # start the logits at a standard deviation of sqrt(d_model) (an initial loss of ~30
        # nats instead of ln 256 = 5.5) and SGD diverges.
        for embedding in (self.tokens, self.positions):
            nn.init.normal_(embedding.weight, std=0.02)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.tokens(x) + self.positions(torch.arange(n, device=x.device))
        h = self.blocks(h, mask=self.mask[:n, :n], is_causal=True)
        return self.norm(h) @ self.tokens.weight.T  # logits over the vocabulary


def parameter_count(size: str) -> int:
    """What TransformerLM of `size` has, from its dimensions alone."""
    d, _, layers, ffn, context, vocab = SIZES[size]
    per_layer = (4 * d * d + 4 * d) + (2 * d * ffn + ffn + d) + 4 * d  # attention, FFN, norms
    return vocab * d + context * d + layers * per_layer + 2 * d


class Transformer(Workload):
    name = "transformer"
    description = ("decoder-only Transformer LM on bytes of real text (Python's shipped docs by "
                   "default, or WikiText / plain text from a path); perplexity")
    Config = TransformerOptions

    @classmethod
    def validate(cls, config):
        if (config.text != PYTHON_DOCS and config.compute != "emulated"
                and not Path(config.text).exists()):
            raise UserError(f"workload transformer: no text at {config.text}; give a text "
                                f"file or a WikiText / *.txt directory, or text = "
                                f"\"{PYTHON_DOCS}\" (shipped with Python)")

    @classmethod
    def real_data(cls, config):
        if config.text == PYTHON_DOCS:
            return "Python's documentation text (pydoc_data)"
        return f"text from {config.text}"

    def build_model(self):
        return TransformerLM(*SIZES[self.config.size])

    @cached_property
    def _split(self) -> tuple[torch.Tensor, torch.Tensor]:
        train, test = read_text(self.config.text)
        return _as_bytes(train), _as_bytes(test)

    def train_batches(self, worker, workers):
        train, _ = self._split
        context = SIZES[self.config.size][4]
        # Each worker reads its own contiguous shard, at seeded random offsets.
        shard = len(train) // workers
        lo = worker * shard
        if shard <= context + 1:
            raise UserError(f"workload transformer: {shard} bytes of text per worker is too "
                            f"little for a context of {context}")
        rng = np.random.default_rng([self.seed, worker])
        while True:
            starts = lo + rng.integers(0, shard - context - 1, self.config.batch_size)
            windows = torch.stack([train[s:s + context + 1] for s in starts])
            yield windows[:, :-1], windows[:, 1:]

    def loss(self, model, batch):
        x, y = batch
        logits = model(x)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model):
        _, test = self._split
        context = SIZES[self.config.size][4]
        starts = np.linspace(0, len(test) - context - 2, TEST_WINDOWS).astype(int)
        windows = torch.stack([test[s:s + context + 1] for s in starts])
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        x, y = windows[:, :-1].to(device), windows[:, 1:].to(device)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           y.reshape(-1)).item()
        accuracy = (logits.argmax(-1) == y).float().mean().item()
        model.train(was_training)
        return {"test_loss": loss, "test_accuracy": accuracy,
                "test_perplexity": math.exp(min(loss, 50.0))}


def read_text(source: str) -> tuple[str, str]:
    """(training text, held-out text) of `source` (see the module docstring)."""
    if source == PYTHON_DOCS:
        from pydoc_data.topics import topics

        # Sorted by topic name: the same text, in the same order, on every machine.
        text = "\n\n".join(topics[k] for k in sorted(topics))
        return _hold_out(text)
    path = Path(source)
    if path.is_file():
        return _hold_out(path.read_text(errors="replace"))
    for train_name, valid_name in (("wiki.train.tokens", "wiki.valid.tokens"),
                                   ("wiki.train.raw", "wiki.valid.raw")):
        if (path / train_name).is_file() and (path / valid_name).is_file():
            return ((path / train_name).read_text(errors="replace"),
                    (path / valid_name).read_text(errors="replace"))
    files = sorted(path.glob("*.txt"))
    if not files:
        raise UserError(f"workload transformer: {path} holds no wiki.train.tokens / "
                        "wiki.valid.tokens and no *.txt files")
    return _hold_out("\n".join(f.read_text(errors="replace") for f in files))


def _as_bytes(text: str) -> torch.Tensor:
    """UTF-8 bytes as token ids (0-255)."""
    return torch.from_numpy(np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64))


def _hold_out(text: str) -> tuple[str, str]:
    cut = int(len(text) * 0.9)
    return text[:cut], text[cut:]
