"""hetbench's layers import downward only, and no import cycle exists (issue 15).

Every `import` statement in the package counts, those inside functions too (a lazy import is
still a dependency; it only hides a cycle until the function runs); imports under
`if TYPE_CHECKING:` do not (they never run). docs/architecture.md draws the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hetbench

ROOT = Path(hetbench.__file__).parent

#: Bottom to top: a module may import its own subpackage and any subpackage below it.
LAYERS = [
    "hetbench.errors",
    "hetbench.testbed",
    "hetbench.slowdown",
    "hetbench.network",
    "hetbench.comm",
    "hetbench.core",
    "hetbench.workloads",
    "hetbench.sim",
    "hetbench.api",
    "hetbench.algorithms",
    "hetbench.harness",
    "hetbench.reports",
    "hetbench.cli",
    "hetbench.__main__",
]


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The hetbench modules `name` imports (a `from X import y` names module X.y when y is one,
    else X)."""
    tree = ast.parse(path.read_text())
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("hetbench") and target != name:
                found.add(target)
    return found


def layer_of(module: str) -> int:
    for index, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return index
    raise AssertionError(f"{module} is in no layer; add its subpackage to LAYERS (and to "
                         "docs/architecture.md)")


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_every_module_is_in_a_layer():
    for module in modules():
        if module != "hetbench":
            layer_of(module)


def test_layers_import_downward_only():
    upward = sorted(f"{module} -> {target}" for module, targets in graph().items()
                    if module != "hetbench" for target in targets
                    if layer_of(target) > layer_of(module))
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_no_import_cycle_between_modules():
    edges = graph()
    cycles = _cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_finds_a_cycle():
    """The check itself can fail: a made-up cycle is found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found
