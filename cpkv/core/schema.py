"""Build typed, frozen config dataclasses from plain dicts, with one-line errors.

This module knows nothing of YAML or OmegaConf: :mod:`cpkv.core.config` turns files and
overrides into plain containers, and :func:`build` checks them against a dataclass
schema. Supported field types: ``int``, ``float``, ``bool``, ``str``, ``Literal[...]``,
``X | None``, ``tuple[X, ...]``, ``dict[str, X]`` and nested dataclasses.

Schemas may define ``validate(self)``, raising :class:`FieldError` (or calling the
helpers below) for constraints that types cannot say (positive sizes, known names).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from cpkv.core.errors import ConfigError
from cpkv.core.suggest import did_you_mean

T = TypeVar("T")


class FieldError(ConfigError):
    """A problem with one field; ``key`` is relative to the dataclass that raised it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.detail = message


def build(cls: type[T], data: Any, path: str = "") -> T:
    """Return ``cls(**data)`` after checking keys and types recursively.

    Raises :class:`FieldError` whose ``key`` is the full dotted path from the root.
    """
    if not isinstance(data, Mapping):
        raise FieldError(path or "<root>", f"expected a mapping, got {_show(data)}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        key = _join(path, str(unknown[0]))
        hint = did_you_mean(unknown[0], names)
        raise FieldError(key, f"unknown key{hint} (allowed here: {', '.join(names)})")
    kwargs = {}
    for name in names:
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], _join(path, name))
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except FieldError as err:
            raise FieldError(_join(path, err.key), err.detail) from None
    return obj


def to_dict(obj: Any) -> Any:
    """A plain, YAML/JSON-ready container for a dataclass instance (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return obj


# -- helpers for validate() ------------------------------------------------------


def require(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise FieldError(key, message)


def positive(key: str, value: float | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    require(value is not None and value > 0, key, f"must be > 0, got {value}")


def non_negative(key: str, value: float | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    require(value is not None and value >= 0, key, f"must be >= 0, got {value}")


def each_positive(key: str, values: Iterable[float]) -> None:
    for v in values:
        require(v > 0, key, f"every value must be > 0, got {v}")


def choices(key: str, values: Iterable[str], allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    for v in values:
        require(
            v in allowed,
            key,
            f"unknown value {v!r}{did_you_mean(v, allowed)} (allowed: {', '.join(allowed)})",
        )


def non_empty(key: str, values: tuple[Any, ...]) -> None:
    require(len(values) > 0, key, "must not be empty")


# -- internals -------------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _show(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"{value!r} ({type(value).__name__})"


def _as_list(item: Any, value: Any, key: str) -> str:
    """``"; a list of one: [8]"`` when ``value`` is a valid item of the list expected."""
    if isinstance(value, Mapping | bytes):
        return ""
    try:
        _convert(item, value, key)
    except (FieldError, TypeError):
        return ""
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    return f"; a list of one: [{shown}]"


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _is_optional(tp: Any) -> bool:
    return _is_union(tp) and type(None) in get_args(tp)


def _strip_none(tp: Any) -> Any:
    args = [a for a in get_args(tp) if a is not type(None)]
    if len(args) != 1:
        raise TypeError(f"schema type {tp!r} is not supported: only `X | None` unions are")
    return args[0]


def _convert(tp: Any, value: Any, key: str) -> Any:
    if tp is Any:
        return value
    if _is_union(tp):
        if value is None:
            if type(None) in get_args(tp):
                return None
            raise FieldError(key, "must not be null")
        return _convert(_strip_none(tp), value, key)
    if value is None:
        raise FieldError(key, f"must not be null (expected {_describe(tp)})")
    origin = get_origin(tp)
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise FieldError(
                key,
                f"unknown value {value!r}{did_you_mean(value, allowed)} "
                f"(allowed: {', '.join(map(str, allowed))})",
            )
        return value
    if origin in (tuple, list):
        if origin is tuple and get_args(tp)[1:] != (Ellipsis,):
            raise TypeError(f"schema type {tp!r} at {key} is not supported: use tuple[X, ...]")
        item = get_args(tp)[0]
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
            raise FieldError(
                key,
                f"expected a list of {_describe(item)}, got {_show(value)}{_as_list(item, value, key)}",
            )
        items = [_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise FieldError(key, f"expected a mapping, got {_show(value)}")
        _, vt = get_args(tp)
        return {str(k): _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    return _scalar(tp, value, key)


def _scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise FieldError(key, f"expected true or false, got {_show(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise FieldError(key, f"expected an integer, got {_show(value)}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise FieldError(key, f"expected a finite number, got {value!r}")
            return float(value)
        raise FieldError(key, f"expected a number, got {_show(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise FieldError(key, f"expected a string, got {_show(value)}")
    raise TypeError(f"schema type {tp!r} at {key} is not supported")


def _describe(tp: Any) -> str:
    if _is_union(tp):
        return " or ".join(_describe(a) for a in get_args(tp))
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(map(str, get_args(tp)))
    names = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}
    if tp in names:
        return names[tp]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return "mappings"
    return str(tp)
