"""Old module paths that keep importing for one release after a move, with a warning.

A plugin written against an earlier release imports from where things were. Each old path is a
small module that calls `moved(...)` and re-exports the new module's names, so the plugin keeps
loading and its author learns the new import (hetbench.api, the public plugin API).
"""

from __future__ import annotations

import warnings


class HetbenchDeprecationWarning(FutureWarning):
    """An import from an old hetbench path (shown by default: plugin authors must see it)."""


def moved(old: str, new: str) -> None:
    """Warn, at the importer's line, that `old` is now `new`."""
    warnings.warn(f"{old} moved: import from {new} instead (hetbench.api is the public plugin "
                  f"API); {old} will be removed in the next release",
                  HetbenchDeprecationWarning, stacklevel=3)
