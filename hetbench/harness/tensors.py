"""Deprecated: where release 0.1's first plugins imported the tensor helpers from
(now hetbench.api)."""

from hetbench.core.moved import moved
from hetbench.core.tensors import *  # noqa: F403
from hetbench.core.tensors import (  # noqa: F401
    buckets,
    flat_grads,
    flat_params,
    set_flat_grads,
    set_flat_params,
)

moved("hetbench.harness.tensors", "hetbench.api")
