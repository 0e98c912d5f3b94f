"""Flattening a model's parameters or gradients into one buffer, and back: pure tensor code."""

from __future__ import annotations

import torch
from torch import nn


def params_of(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def flat_params(model: nn.Module) -> torch.Tensor:
    """A new 1-D tensor holding all trainable parameters."""
    return torch.cat([p.detach().reshape(-1) for p in params_of(model)])


def flat_params_numel(model: nn.Module) -> int:
    """How many of flat_state's leading entries are parameters."""
    return sum(p.numel() for p in params_of(model))


def flat_grads(model: nn.Module) -> torch.Tensor:
    """A new 1-D tensor holding all gradients (zeros where a parameter has none)."""
    return torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
        for p in params_of(model)
    ])


@torch.no_grad()
def set_flat_params(model: nn.Module, flat: torch.Tensor) -> None:
    offset = 0
    for p in params_of(model):
        n = p.numel()
        p.copy_(flat[offset:offset + n].view_as(p))
        offset += n


def float_buffers_of(model: nn.Module) -> list[torch.Tensor]:
    """Persistent floating-point buffers (batch norm's running mean and variance): part of the
    state a model is evaluated with, though no optimizer step changes them. Non-persistent
    buffers (a Transformer's causal mask) are constants of the model, not state."""
    if next(model.buffers(), None) is None:  # most models: skip building the state dict
        return []
    buffers = {id(b) for b in model.buffers()}
    return [t for t in model.state_dict(keep_vars=True).values()
            if id(t) in buffers and t.is_floating_point()]


def flat_state(model: nn.Module) -> torch.Tensor:
    """A new 1-D tensor holding the trainable parameters, then the floating-point buffers: what
    evaluating a model needs (the same as flat_params for a model without buffers)."""
    params = params_of(model)
    return torch.cat([t.detach().reshape(-1).to(params[0].dtype)
                      for t in [*params, *float_buffers_of(model)]])


@torch.no_grad()
def set_flat_state(model: nn.Module, flat: torch.Tensor) -> None:
    offset = 0
    for t in [*params_of(model), *float_buffers_of(model)]:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n


@torch.no_grad()
def set_flat_grads(model: nn.Module, flat: torch.Tensor) -> None:
    offset = 0
    for p in params_of(model):
        n = p.numel()
        if p.grad is None:
            p.grad = torch.empty_like(p)
        p.grad.copy_(flat[offset:offset + n].view_as(p))
        offset += n


def buckets(tensors: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Split tensors, in order, into consecutive buckets of about `bucket_bytes` each."""
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if out[-1] and size + nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(t)
        size += nbytes
    return out
