"""Sweep grids: ``sweep:`` blocks and ``KEY=a,b,c`` overrides -> axes -> points.

An *axis* is one dimension of the grid: one key, or several ``zip:`` keys that move in
lock-step. Each position on an axis is a tuple of override values (OmegaConf dotlist text,
one per key). The grid is the cartesian product of the axes, last axis fastest.

Syntax (in a config file)::

    sweep:
      alloc_host.protocol: [cold, warm]          # 2 points
      alloc_host.request_pages: [[1, 8], [64]]   # a list-valued key: each value is a list
      alloc_host.host_pages: [600, 1200]         # ...or a scalar, which becomes [600] / [1200]
      zip:                                       # lock-step: (8, 3), (64, 5)
        alloc_host.page_size: [8, 64]
        alloc_host.repeat: [3, 5]

``zip:`` may also be a list of such mappings (several lock-step groups). On the command
line, ``KEY=a,b,c`` sweeps KEY (a top-level comma; ``KEY=[a,b]`` is one list value),
``KEY=range(1,4)`` sweeps 1, 2, 3, and ``--zip K1,K2`` ties command-line keys together.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from cpkv.core.config import yaml_line
from cpkv.core.errors import ConfigError

ZIP_KEY = "zip"
SWEEP_KEY = "sweep"
COMMAND_LINE = "command line"
_RANGE = re.compile(r"^range\((?P<args>[^()]*)\)$")
_BARE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.+-]*$")


@dataclass(frozen=True)
class Axis:
    """One grid dimension: ``keys`` and, per position, one override value text per key.

    ``origin`` is the config file of a ``sweep:`` block (or :data:`COMMAND_LINE`); ``at``
    holds, per key, where its list stands in that file (a :func:`yaml_line` path).
    """

    keys: tuple[str, ...]
    values: tuple[tuple[str, ...], ...]
    origin: str
    at: tuple[tuple[str | int, ...], ...] = ()

    def __len__(self) -> int:
        return len(self.values)

    def where(self, key: str, value: str | None = None) -> str:
        """``file:line`` of ``key``'s list (of ``value`` in it, when given) in the config file."""
        if not self.at or key not in self.keys:
            return self.origin
        i = self.keys.index(key)
        path = self.at[i]
        column = [pos[i] for pos in self.values]
        if value is not None and value in column:
            path = (*path, column.index(value))
        return _where(self.origin, path)


def expand(axes: Sequence[Axis]) -> list[dict[str, str]]:
    """The cartesian product of ``axes`` (last axis fastest): one ``{key: value text}`` per point."""
    points = []
    for combo in itertools.product(*(ax.values for ax in axes)):
        point: dict[str, str] = {}
        for ax, values in zip(axes, combo, strict=True):
            point.update(zip(ax.keys, values, strict=True))
        points.append(point)
    return points


def axes_from_block(block: Any, source: str) -> list[Axis]:
    """Axes of a config file's ``sweep:`` block, in file order (``zip:`` where it stands)."""
    if block is None:
        return []
    if not isinstance(block, Mapping):
        raise ConfigError(
            f"{_where(source, (SWEEP_KEY,))}: sweep: expected a mapping of dotted keys to lists of values"
        )
    axes = []
    for key, values in block.items():
        if key == ZIP_KEY:
            if isinstance(values, list):
                axes.extend(
                    _zip_axis(g, source, (SWEEP_KEY, ZIP_KEY, i)) for i, g in enumerate(values)
                )
            else:
                axes.append(_zip_axis(values, source, (SWEEP_KEY, ZIP_KEY)))
        else:
            at = (SWEEP_KEY, str(key))
            column = _value_list(values, source, at, f"sweep.{key}")
            axes.append(Axis((str(key),), tuple((v,) for v in column), source, (at,)))
    _check_unique(axes)
    return axes


def _zip_axis(group: Any, source: str, at: tuple[str | int, ...]) -> Axis:
    if not isinstance(group, Mapping) or not group:
        raise ConfigError(
            f"{_where(source, at)}: sweep.zip: expected a mapping of dotted keys to equally long lists"
        )
    keys = tuple(str(k) for k in group)
    ats = tuple((*at, k) for k in keys)
    columns = [
        _value_list(group[k], source, ka, f"sweep.zip.{k}")
        for k, ka in zip(group, ats, strict=True)
    ]
    lengths = {len(c) for c in columns}
    if len(lengths) != 1:
        shown = ", ".join(f"{k}: {len(c)}" for k, c in zip(keys, columns, strict=True))
        raise ConfigError(
            f"{_where(source, at)}: sweep.zip: lists moving in lock-step must be equally long (got {shown})"
        )
    return Axis(keys, tuple(zip(*columns, strict=True)), source, ats)


def _value_list(values: Any, source: str, at: tuple[str | int, ...], label: str) -> list[str]:
    if not isinstance(values, list) or not values:
        raise ConfigError(
            f"{_where(source, at)}: {label}: expected a non-empty list of values to sweep, got {values!r}"
        )
    column = []
    for i, value in enumerate(values):
        try:
            column.append(format_value(value, label))
        except ConfigError as err:
            raise ConfigError(f"{_where(source, (*at, i))}: {err}") from None
    return column


def _where(source: str, at: Sequence[str | int]) -> str:
    """``source:line`` of the node at ``at`` in the config file (``source`` alone when unknown)."""
    line = yaml_line(source, at)
    return f"{source}:{line}" if line else source


def axes_from_overrides(
    overrides: Sequence[str], zips: Sequence[str] = ()
) -> tuple[list[str], list[Axis]]:
    """Split command-line overrides into plain ones and sweep axes (``KEY=a,b``, ``KEY=range(..)``)."""
    plain, swept = [], {}
    for item in overrides:
        key, eq, value = item.partition("=")
        key = key.strip()
        items = split_top_level(value) if eq else [value]
        match = _RANGE.match(value.strip())
        if match:
            items = [str(v) for v in _range(match.group("args"), item)]
        if len(items) > 1:
            if key in swept:
                raise ConfigError(f"override {item!r}: {key} is swept twice on the command line")
            if any(not v.strip() for v in items):
                raise ConfigError(f"override {item!r}: empty value in the list of values to sweep")
            swept[key] = [v.strip() for v in items]
        else:
            plain.append(item)
    group_of = {}
    for group in zips:
        keys = tuple(k.strip() for k in group.split(",") if k.strip())
        missing = [k for k in keys if k not in swept]
        if missing or len(keys) < 2:
            raise ConfigError(
                f"--zip {group}: name two or more keys swept on the command line (KEY=a,b); "
                f"not swept: {', '.join(missing) or '-'}"
            )
        if len({len(swept[k]) for k in keys}) != 1:
            shown = ", ".join(f"{k}: {len(swept[k])}" for k in keys)
            raise ConfigError(
                f"--zip {group}: keys moving in lock-step need equally many values (got {shown})"
            )
        for k in keys:
            if k in group_of:
                raise ConfigError(f"--zip {group}: {k} is already in another --zip group")
            group_of[k] = keys
    axes, done = [], set()
    for key in swept:  # command-line order; a zip group stands where its first key stands
        keys = group_of.get(key, (key,))
        if keys not in done:
            done.add(keys)
            axes.append(
                Axis(keys, tuple(zip(*(swept[k] for k in keys), strict=True)), COMMAND_LINE)
            )
    return plain, axes


def split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets, braces, parentheses and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _range(args: str, item: str) -> list[int | float]:
    try:
        nums = [json.loads(a.strip()) for a in args.split(",")]
    except json.JSONDecodeError:
        nums = []
    if not 1 <= len(nums) <= 3 or not all(
        isinstance(n, int | float) and not isinstance(n, bool) for n in nums
    ):
        raise ConfigError(
            f"override {item!r}: range takes 1 to 3 numbers: range(stop), range(start,stop[,step])"
        )
    start, stop, step = (
        (0, nums[0], 1) if len(nums) == 1 else (nums[0], nums[1], nums[2] if len(nums) == 3 else 1)
    )
    if step == 0:
        raise ConfigError(f"override {item!r}: range step must not be 0")
    count = max(0, math.ceil((stop - start) / step))
    if count == 0:
        raise ConfigError(f"override {item!r}: the range is empty")
    return [start + i * step for i in range(count)]


def format_value(value: Any, where: str = "value") -> str:
    """A plain value as OmegaConf dotlist text (``[1, 8]``, ``warm``, ``"a b"``, ``null``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        bare = _BARE.match(value) is not None and yaml.safe_load(value) == value
        return value if bare else _quote(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(v, where) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {format_value(v, where)}" for k, v in value.items()) + "}"
    raise ConfigError(f"{where}: cannot sweep a value of type {type(value).__name__}")


def _quote(text: str) -> str:
    """A YAML double-quoted scalar: printable characters as they are, the rest escaped."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(
                f"\\x{code:02x}"
                if code < 0x100
                else f"\\u{code:04x}"
                if code < 0x10000
                else f"\\U{code:08x}"
            )
    return '"' + "".join(out) + '"'


def _check_unique(axes: Sequence[Axis]) -> None:
    seen: set[str] = set()
    for ax in axes:
        for key in ax.keys:
            if key in seen:
                raise ConfigError(f"{ax.where(key)}: sweep: {key} is swept twice")
            seen.add(key)
