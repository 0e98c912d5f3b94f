"""Deprecated: where release 0.1's first plugins imported Algorithm and StepInfo from
(now hetbench.api)."""

from hetbench.core.algorithm import *  # noqa: F403
from hetbench.core.algorithm import Algorithm, NoOptions, StepInfo  # noqa: F401
from hetbench.core.moved import moved

moved("hetbench.algorithms.base", "hetbench.api")
