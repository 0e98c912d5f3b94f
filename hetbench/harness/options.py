"""Deprecated: where release 0.1's first plugins imported opt from (now hetbench.api)."""

from hetbench.core.moved import moved
from hetbench.core.options import *  # noqa: F403
from hetbench.core.options import build_config, describe_options, opt  # noqa: F401

moved("hetbench.harness.options", "hetbench.api")
