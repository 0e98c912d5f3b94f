"""Turning a plain dict of options (from TOML or flags) into a component's frozen Config."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from hetbench.errors import UserError


def build_config(config_cls: type, options: dict[str, Any], owner: str) -> Any:
    """Instantiate `config_cls` from `options`, with one-line UserErrors for unknown keys/types."""
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields)) or "(none)"
        raise UserError(f"{owner}: unknown option(s) {', '.join(unknown)}; options are: {known}")
    hints = typing.get_type_hints(config_cls)
    checked = {}
    for key, value in options.items():
        checked[key] = _coerce(value, hints[key], f"{owner}: option {key}")
    try:
        return config_cls(**checked)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{owner}: {exc}") from None


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Check a TOML value against a type hint; ints are accepted where floats are expected."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(hint):
            try:
                return _coerce(value, arm, where)
            except UserError as exc:
                errors.append(str(exc))
        raise UserError(errors[0])
    if hint is type(None):
        if value is None:
            return None
        raise UserError(f"{where} must be empty")
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            choices = ", ".join(map(repr, allowed))
            raise UserError(f"{where} must be one of {choices}, got {value!r}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{where} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise UserError(f"{where} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise UserError(f"{where} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{where} must be a string, got {value!r}")
    if isinstance(hint, type) and issubclass(hint, str) and hasattr(hint, "__members__"):
        try:
            return hint(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in hint)
            raise UserError(f"{where} must be one of {allowed}, got {value!r}") from None
    return value


def describe_options(config_cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, one-line doc) of each option, for `bench list`."""
    docs = _field_docs(config_cls)
    out = []
    for f in dataclasses.fields(config_cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        out.append((f.name, default, docs.get(f.name, "")))
    return out


def _field_docs(config_cls: type) -> dict[str, str]:
    """Field docs from `#: doc` comments or the class's `field_docs` dict."""
    docs = dict(getattr(config_cls, "field_docs", {}))
    for f in dataclasses.fields(config_cls):
        if "doc" in f.metadata:
            docs[f.name] = f.metadata["doc"]
    return docs


def opt(default: Any, doc: str, added_later: bool = False) -> Any:
    """A Config field with a one-line doc shown by `bench list`.

    added_later: the option joined a Config that already had stored runs. While it is at its
    default it stays out of a run's identity (RunConfig.config_hash), so those runs keep their
    ids and a rerun still skips them.
    """
    return dataclasses.field(default=default,
                             metadata={"doc": doc, "added_later": added_later})


def added_later_defaults(config_cls: type) -> dict[str, Any]:
    """{name: default} of config_cls's options marked added_later."""
    return {f.name: f.default for f in dataclasses.fields(config_cls)
            if f.metadata.get("added_later")}
