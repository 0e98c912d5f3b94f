"""Deprecated: where release 0.1's first plugins imported WorkerContext from (now hetbench.api)."""

from hetbench.core.context import *  # noqa: F403
from hetbench.core.context import WorkerContext  # noqa: F401
from hetbench.core.moved import moved

moved("hetbench.harness.context", "hetbench.api")
