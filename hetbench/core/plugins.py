"""Plugins loaded for one command, without installing them: `--plugin PATH_OR_MODULE` and
`HETBENCH_PLUGINS` (os.pathsep-separated, the same specs).

A spec is read as
- a path to a `.py` file: imported as a module named after the file (`my_algo.py` -> `my_algo`);
  the file stands alone (a plugin of several modules is a package directory);
- a directory with `__init__.py`: a package, imported by its directory's name (its parent goes
  on sys.path);
- any other directory: put on sys.path, and the `hetbench.algorithms` / `hetbench.workloads`
  entry points of the distributions in it (what `pip install --target DIR` leaves) are
  registered as if installed;
- anything else: a dotted module name, imported from sys.path (an installed package, say).

A module (or package) so loaded registers every class it defines, or imports from its own
submodules, that subclasses `hetbench.api.Algorithm` or `hetbench.api.Workload` and sets its
own `name`: nothing else to call. Its names must not be built-in ones; they take the place of
an installed entry point of the same name (the source being worked on wins over a stale
install).

The CLI loads HETBENCH_PLUGINS, then its `--plugin` specs, and sets HETBENCH_PLUGINS to all of
them (paths made absolute) so that every rank a run starts loads the same (hetbench.harness.
worker does, first thing; the launchers pass the variable on, to other hosts too). Bad specs
are a UserError: one line, exit 2.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from importlib.metadata import distributions
from pathlib import Path
from types import ModuleType

from hetbench.core.algorithm import Algorithm
from hetbench.core.registry import ALGORITHMS, WORKLOADS, Registry
from hetbench.core.workload import Workload
from hetbench.errors import UserError

PLUGINS_ENV = "HETBENCH_PLUGINS"
#: How the flag is named in messages and help.
FLAG = "--plugin PATH_OR_MODULE"

_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
#: Normalized spec -> the names it registered, for each spec loaded in this process.
_loaded: dict[str, list[str]] = {}


def specs_from_environment() -> list[str]:
    """HETBENCH_PLUGINS's specs, in order (empty entries ignored)."""
    return [s for s in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if s.strip()]


def load_from_environment() -> list[str]:
    """Load HETBENCH_PLUGINS's specs (each once per process); the names they registered."""
    return load(specs_from_environment(), source=PLUGINS_ENV)


def use(specs: list[str] | tuple[str, ...]) -> list[str]:
    """Load `specs` (the CLI's --plugin values) after HETBENCH_PLUGINS's, and set
    HETBENCH_PLUGINS to all of them, paths made absolute, so that the ranks and tools this
    process starts load the same wherever they run; the names registered."""
    names = load_from_environment()
    resolved = [resolve(spec) for spec in specs]
    names += load(resolved, source="--plugin")
    combined = [resolve_for(spec, PLUGINS_ENV) for spec in specs_from_environment()]
    os.environ[PLUGINS_ENV] = os.pathsep.join(dict.fromkeys([*combined, *resolved]))
    return names


def resolve(spec: str) -> str:
    """The spec as every process reads it alike: an existing path made absolute (ranks may run
    in another directory, on another host), a module name as given; UserError when it is
    neither."""
    spec = spec.strip()
    path = Path(spec).expanduser()
    if path.exists():
        return str(path.resolve())
    if spec.endswith(".py") or "/" in spec or os.sep in spec or not _DOTTED.fullmatch(spec):
        raise UserError(f"plugin {spec!r}: no such file or directory (a plugin is a .py file, "
                        "a directory or a dotted module name)")
    return spec


def load(specs: list[str], source: str = "--plugin") -> list[str]:
    """Load each spec not loaded yet in this process; the names registered."""
    names: list[str] = []
    for spec in specs:
        key = resolve_for(spec, source)
        if key not in _loaded:
            _loaded[key] = _load_one(key)
        names += _loaded[key]
    return names


def resolve_for(spec: str, source: str) -> str:
    """resolve(spec), its error saying where the spec came from."""
    try:
        return resolve(spec)
    except UserError as exc:
        raise UserError(f"{exc} (from {source})") from None


def loaded() -> dict[str, list[str]]:
    """The specs loaded in this process and the names each registered."""
    return dict(_loaded)


def _load_one(spec: str) -> list[str]:
    path = Path(spec)
    if path.is_absolute() and path.is_file():
        if path.suffix != ".py":
            raise UserError(f"plugin {spec}: not a .py file (a plugin is a .py file, a "
                            "directory or a dotted module name)")
        names = _register_classes(_import_file(path), spec)
    elif path.is_absolute() and path.is_dir():
        if (path / "__init__.py").is_file():
            names = _register_classes(_import_package_dir(path), spec)
        else:
            names = _register_target_dir(path)
    else:
        names = _register_classes(_import_module(spec), spec)
    if not names:
        raise UserError(
            f"plugin {spec} registers no algorithm or workload: define a subclass of "
            "hetbench.api.Algorithm or hetbench.api.Workload with its own `name` in it"
            + ("" if path.is_absolute() else " (or export it from the package's __init__)"))
    return names


def _import_file(path: Path) -> ModuleType:
    name = re.sub(r"\W", "_", path.stem)
    if name[0].isdigit():
        name = f"_{name}"
    existing = sys.modules.get(name)
    if existing is not None:
        if Path(getattr(existing, "__file__", "") or "").resolve() == path:
            return existing
        where = getattr(existing, "__file__", None) or "a built-in module"
        raise UserError(f"plugin {path}: its module name {name!r} is taken (by {where}); "
                        "rename the file")
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise UserError(f"plugin {path}: Python cannot import it")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up by name
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise _import_error(str(path), exc) from exc
    return module


def _import_package_dir(path: Path) -> ModuleType:
    name = path.name
    if not _DOTTED.fullmatch(name) or "." in name:
        raise UserError(f"plugin {path}: a package directory's name must be a Python "
                        "identifier to import it by")
    existing = sys.modules.get(name)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() != (
            path / "__init__.py").resolve():
        where = getattr(existing, "__file__", None) or "a built-in module"
        raise UserError(f"plugin {path}: its package name {name!r} is taken (by {where}); "
                        "rename the directory")
    parent = str(path.parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    return _import_module(name, str(path))


def _import_module(name: str, shown: str | None = None) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if shown is None and exc.name is not None and (
                name == exc.name or name.startswith(exc.name + ".")):
            raise UserError(f"plugin {name!r}: no module named {exc.name!r} on sys.path (and no "
                            "file or directory of that name here)") from exc
        raise _import_error(shown or name, exc) from exc
    except Exception as exc:
        raise _import_error(shown or name, exc) from exc


def _import_error(spec: str, exc: BaseException) -> UserError:
    message = (str(exc).strip().splitlines() or [""])[0]
    where = ""
    if isinstance(exc, SyntaxError):  # its str() names the file without its directory
        message, where = exc.msg, f" ({exc.filename}, line {exc.lineno})"
    return UserError(f"plugin {spec} failed to import: {type(exc).__name__}: {message}{where} "
                     "(--debug shows the traceback)")


def _register_classes(module: ModuleType, spec: str) -> list[str]:
    """Register the Algorithm and Workload subclasses `module` holds that are its own (defined
    in it or in its submodules, so that an imported base class is not registered again) and
    set their own `name`."""
    prefix = module.__name__
    names = []
    for value in list(vars(module).values()):
        if not isinstance(value, type) or "name" not in vars(value):
            continue
        if value.__module__ != prefix and not value.__module__.startswith(prefix + "."):
            continue
        if value.__module__.split(".")[0] == "hetbench":
            continue  # hetbench's own classes are built-ins
        for base, registry in ((Algorithm, ALGORITHMS), (Workload, WORKLOADS)):
            if issubclass(value, base) and isinstance(value.name, str) and value.name:
                _add(registry, value.name, value, spec)
                names.append(value.name)
    return names


def _register_target_dir(path: Path) -> list[str]:
    """A `pip install --target` directory: on sys.path, and its distributions' entry points."""
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    names = []
    for dist in distributions(path=[str(path)]):
        for ep in dist.entry_points:
            registry = {ALGORITHMS.entry_point_group: ALGORITHMS,
                        WORKLOADS.entry_point_group: WORKLOADS}.get(ep.group)
            if registry is not None:
                _add(registry, ep.name, ep.value, str(path),
                     (dist.metadata["Name"], dist.version))
                names.append(ep.name)
    if not names:
        raise UserError(
            f"plugin {path}: a directory loads as a package (it has __init__.py) or as a "
            "`pip install --target` directory (its *.dist-info with entry points in "
            f"{ALGORITHMS.entry_point_group} or {WORKLOADS.entry_point_group}); it has "
            "neither: pass the .py file or the package directory in it")
    return names


def _add(registry: Registry, name: str, target, spec: str,
         distribution: tuple[str, str] | None = None) -> None:
    try:
        registry.add_plugin(name, target, spec, distribution)
    except UserError as exc:
        raise UserError(f"plugin {spec}: {exc}") from None
