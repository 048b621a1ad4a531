"""Shared plumbing for plots: the optional matplotlib import, labels, grouping, axes
(figures, styles and saving: :mod:`cpkv.plots.figures`)."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from cpkv.core.errors import UnsupportedError

_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def require_matplotlib() -> None:
    """UnsupportedError (exit 2) with an install hint when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise UnsupportedError("plots need matplotlib: pip install 'cpkv[plot]'")


def file_stem(prefix: str, values: Mapping[str, Any]) -> str:
    """``latency_op=alloc_total_pages=600`` from a prefix and the values a figure is split on."""
    parts = [prefix, *(f"{k}={label(v)}" for k, v in values.items())]
    return _UNSAFE.sub("-", "_".join(parts))[:120]


def label(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "+".join(map(str, value))
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def varying(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[str]:
    """The columns whose values are not the same in every row."""
    out = []
    for col in columns:
        if len({json.dumps(r.get(col), sort_keys=True) for r in rows}) > 1:
            out.append(col)
    return out


def group_by(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str]
) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Rows grouped by their values of ``columns`` (first-seen order)."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(
            tuple(json.dumps(row.get(c), sort_keys=True) for c in columns), []
        ).append(row)
    return groups


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_UNITS = (
    ("_per_s", "per s"), ("_pct", "%"), ("_us", "µs"), ("_ms", "ms"), ("_s", "s"),
    ("_tokens", "tokens"),
)  # fmt: skip


def axis_label(name: str) -> str:
    """A metric name as an axis label with its unit: ``ttft_p50_ms`` -> ``ttft p50 (ms)``,
    ``vs_fifo_p99`` -> ``vs fifo p99 (x)``, ``ticks`` -> ``ticks``."""
    leaf = name.split(".")[-1]
    for suffix, unit in _UNITS:
        if leaf.endswith(suffix) and len(leaf) > len(suffix):
            stem = name[: len(name) - len(suffix)]
            return f"{stem.replace('_', ' ')} ({unit})"
    if leaf.startswith("vs_") or "_vs_" in leaf:
        return f"{name.replace('_', ' ')} (x)"
    return name.replace("_", " ")


def integer_axis(ax: Any, axis: str = "y") -> None:
    """Ticks at whole numbers only (counts, ticks, tokens): never 1.5 ticks; as many as the
    axis has room for (matplotlib's automatic density, not ten on a short panel)."""
    from matplotlib.ticker import MaxNLocator

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(MaxNLocator(nbins="auto", integer=True))


def all_integers(values: Sequence[Any]) -> bool:
    return all(
        isinstance(v, int) or (isinstance(v, float) and v.is_integer())
        for v in values
        if v is not None
    )


def human(value: float, top: float | None = None) -> str:
    """A tick label without exponents: 15.6M, 250k, 1500, 0.25. ``top`` (the largest value on
    the axis) picks one unit for every label of an axis."""
    if value == 0:
        return "0"
    size = abs(value) if top is None else abs(top)
    for limit, div, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e5, 1e3, "k")):
        if size >= limit:
            return f"{value / div:.4g}{suffix}"
    return f"{value:.6g}"


def human_axis(ax: Any, axis: str = "y") -> None:
    """Tick labels as :func:`human` numbers in one unit per axis (no ``1e7`` offset above it)."""
    from matplotlib.ticker import FuncFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    limits = ax.get_ylim if axis == "y" else ax.get_xlim
    target.set_major_formatter(FuncFormatter(lambda v, _: human(v, max(abs(x) for x in limits()))))
