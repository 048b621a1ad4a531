"""Build typed, frozen config dataclasses from plain dicts, with one-line errors.

This module knows nothing of YAML or OmegaConf: :mod:`cpkv.core.config` turns files and
overrides into plain containers, and :func:`build` checks them against a dataclass
schema. Supported field types: ``int``, ``float``, ``bool``, ``str``, ``Literal[...]``,
``X | None``, ``tuple[X, ...]``, ``dict[str, X]`` and nested dataclasses.

A key's physical bounds sit next to its type: ``Annotated[float, Range(...)]`` (a
:class:`Range` says the lowest and highest value allowed and why: the float clock's
resolution, a GPU faster than any made, ...); :func:`build` checks them after the type, and
:func:`field_form` says a field's type and bounds (:mod:`cpkv.core.schema.keys` walks a
whole schema with it). Schemas may define ``validate(self)``, raising :class:`FieldError`
(or calling the helpers below) for constraints that types and bounds cannot say (rules
across keys, known names).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

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


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a number may take: ``low`` and ``high`` (None: no bound), each included
    unless ``low_open`` / ``high_open``; ``why`` says where the upper bound comes from and
    ``low_why`` the lower one (shown in the refusal)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""
    low_why: str = ""

    def problem(self, value: float) -> str | None:
        """Why ``value`` is out of range (``must be <= 1 (...)``), or None."""
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            op = ">" if self.low_open else ">="
            return f"must be {op} {_number(self.low)}{_why(self.low_why)}"
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            op = "<" if self.high_open else "<="
            return f"must be {op} {_number(self.high)}{_why(self.why)}"
        return None

    def check(self, key: str, value: Any) -> None:
        """FieldError naming ``key`` when ``value`` (a number, or None: no value) is out of range."""
        if value is None:
            return
        problem = self.problem(value)
        if problem is not None:
            raise FieldError(key, f"{problem}, got {_number(value)}")


def field_form(cls: type, name: str) -> tuple[Any, bool, bool, tuple[Range, ...]]:
    """Field ``name`` of the schema ``cls``: its type without bounds, null or list around it,
    whether null is allowed, whether it is a list of such values, and its bounds (those of
    the value, or of each item of the list)."""
    tp, ranges = _unannotated(_hints(cls)[name])
    nullable = _is_optional(tp)
    if nullable:
        tp, more = _unannotated(_strip_none(tp))
        ranges += more
    is_list = get_origin(tp) in (tuple, list)
    if is_list:
        tp, more = _unannotated(get_args(tp)[0])
        ranges += more
    return tp, nullable, is_list, ranges


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
        if v not in allowed:
            raise FieldError(
                key,
                f"unknown value {v!r}{did_you_mean(v, allowed)} (allowed: {', '.join(allowed)})",
            )


def non_empty(key: str, values: tuple[Any, ...]) -> None:
    require(len(values) > 0, key, "must not be empty")


# -- internals -------------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _unannotated(tp: Any) -> tuple[Any, tuple[Range, ...]]:
    """``tp`` without ``Annotated``, and the ranges it carried."""
    if get_origin(tp) is Annotated:
        base, *meta = get_args(tp)
        return base, tuple(m for m in meta if isinstance(m, Range))
    return tp, ()


def _number(value: float) -> str:
    """A bound or a value as a user reads it: integers whole, floats by ``repr`` (``1e+30``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if isinstance(value, int) and abs(value) >= 10**16:
        return (
            f"{value:.6g}"
            if abs(value) < 10**300
            else f"an integer of {len(str(abs(value)))} digits"
        )
    return repr(value) if isinstance(value, float) else str(value)


def _why(text: str) -> str:
    return f" ({text})" if text else ""


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


_ANY, _ANNOTATED, _UNION, _LITERAL, _SEQUENCE, _MAPPING, _DATACLASS, _SCALAR = range(8)


@functools.cache
def _form(tp: Any) -> tuple:
    """What kind of schema type ``tp`` is, with the parts :func:`_convert` reads (once per
    type: configs are built often, from the same few hundred types)."""
    if tp is Any:
        return (_ANY,)
    origin = get_origin(tp)
    if origin is Annotated:
        return (_ANNOTATED, *_unannotated(tp))
    if origin in (Union, types.UnionType):
        return (_UNION, type(None) in get_args(tp))
    if origin is Literal:
        return (_LITERAL, get_args(tp))
    if origin in (tuple, list):
        return (_SEQUENCE, origin, get_args(tp))
    if origin in (dict, Mapping):
        return (_MAPPING, get_args(tp)[1])
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return (_DATACLASS,)
    return (_SCALAR,)


def _convert(tp: Any, value: Any, key: str) -> Any:
    form = _form(tp)
    kind = form[0]
    if kind == _ANY:
        return value
    if kind == _ANNOTATED:
        out = _convert(form[1], value, key)
        for r in form[2]:
            r.check(key, out)
        return out
    if kind == _UNION:
        if value is None:
            if form[1]:
                return None
            raise FieldError(key, "must not be null")
        return _convert(_strip_none(tp), value, key)
    if value is None:
        raise FieldError(key, f"must not be null (expected {_describe(tp)})")
    if kind == _LITERAL:
        allowed = form[1]
        if value not in allowed:
            raise FieldError(
                key,
                f"unknown value {value!r}{did_you_mean(value, allowed)} "
                f"(allowed: {', '.join(map(str, allowed))})",
            )
        return value
    if kind == _SEQUENCE:
        origin, args = form[1], form[2]
        if origin is tuple and args[1:] != (Ellipsis,):
            raise TypeError(f"schema type {tp!r} at {key} is not supported: use tuple[X, ...]")
        item = args[0]
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
            raise FieldError(
                key,
                f"expected a list of {_describe(item)}, got {_show(value)}{_as_list(item, value, key)}",
            )
        items = [_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if kind == _MAPPING:
        if not isinstance(value, Mapping):
            raise FieldError(key, f"expected a mapping, got {_show(value)}")
        vt = form[1]
        return {str(k): _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if kind == _DATACLASS:
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
    if get_origin(tp) is Annotated:
        return _describe(_unannotated(tp)[0])
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
