"""Plots of a sweep: each headline metric against each swept key (matplotlib imported lazily).

One PNG per swept key (``sweep_<key>.png``; ``sweep_<key>_2.png``, ... when the points of that
key have more than ``PANELS_PER_FILE`` headline metrics: none is dropped), one panel per
headline metric, drawn from the completed points that swept that key (in a sweep of several
configs, the others do not have it). One line per combination of the other swept values
that vary among those points (and of the config, when several swept the key), named by one
legend beside the panels (only what varies); past ten lines the ten colours repeat with
other line styles and markers, no two lines alike. A numeric key (or a one-element list of a
number, as ``host_pages: [600]``) is a numeric axis, ticked at its values when it has at most
``FEW_VALUES``; any other key is categorical. Every figure's title names the sweep; every
axis names its unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpkv.plots.common import (
    all_integers,
    axis_label,
    file_stem,
    group_by,
    human_axis,
    integer_axis,
    is_number,
    label,
)
from cpkv.plots.figures import figure, save, series_styles

PANELS_PER_FILE = 6
FEW_VALUES = 8
"""A numeric key with at most this many values has a tick at each value, and only there."""
_ABSENT = object()


def plot_sweep(summary: Mapping[str, Any], out: Path, title: str | None = None) -> list[Path]:
    """PNGs of ``summary.json``'s headline metrics against every swept key."""
    points = [
        p
        for p in summary.get("points") or []
        if p.get("status") == "complete" and p.get("headline")
    ]
    name = title or f"sweep {summary.get('name')}"
    paths: list[Path] = []
    for key in summary.get("swept_keys") or []:
        mine = [p for p in points if key in (p.get("swept") or {})]
        rows = [_row(p) for p in mine]
        if len({label(r[key]) for r in rows}) < 2:
            continue
        metrics = list(dict.fromkeys(m for p in mine for m in p["headline"]))
        others = [k for k in summary.get("swept_keys") or [] if k != key]
        pages = [metrics[i : i + PANELS_PER_FILE] for i in range(0, len(metrics), PANELS_PER_FILE)]
        for n, page in enumerate(pages, 1):
            stem = file_stem("sweep_" + key, {}) + ("" if n == 1 else f"_{n}")
            part = f" ({n}/{len(pages)})" if len(pages) > 1 else ""
            paths.append(_figure(rows, key, others, page, f"{name}{part}", out / f"{stem}.png"))
    return paths


def _row(point: Mapping[str, Any]) -> dict[str, Any]:
    swept = point.get("swept") or {}
    row: dict[str, Any] = {k: _scalar(v) for k, v in swept.items()}
    row["config"] = point.get("config_name")
    row.update(point["headline"])
    return row


def _figure(
    rows: list[dict], key: str, others: list[str], metrics: list[str], title: str, path: Path
) -> Path:
    numeric = all(is_number(r[key]) for r in rows)
    categories = list(dict.fromkeys(_word(r[key]) for r in rows))
    series_cols = [
        c for c in ["config", *others] if len({label(r.get(c, _ABSENT)) for r in rows}) > 1
    ]
    lines = list(group_by(rows, series_cols).values())
    styles = series_styles(len(lines))
    cols = 2 if len(metrics) > 1 else 1
    nrows = math.ceil(len(metrics) / cols)
    fig = figure(5.6 * cols, 3.4 * nrows + 0.8)
    axes = fig.subplots(nrows, cols, squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for line, style in zip(lines, styles, strict=True):
            line = [r for r in line if is_number(r.get(metric))]
            if not line:
                continue
            if numeric:
                line.sort(key=lambda r: r[key])
                xs: Sequence[Any] = [r[key] for r in line]
            else:
                xs = [categories.index(_word(r[key])) for r in line]
            ax.plot(xs, [r[metric] for r in line], ms=4, label=_legend(line[0], series_cols),
                    **style)  # fmt: skip
        if not numeric:
            ax.set_xticks(range(len(categories)), categories, rotation=20, fontsize=8)
        else:
            ticks = sorted({r[key] for r in rows})
            if _log_scale(ticks):
                ax.set_xscale("log", base=2)
                ax.set_xticks(ticks, [f"{t:g}" for t in ticks], fontsize=8)
            elif len(ticks) <= FEW_VALUES:
                ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            elif all_integers(ticks):
                integer_axis(ax, "x")
        if all_integers([r.get(metric) for r in rows if is_number(r.get(metric))]):
            integer_axis(ax, "y")
        human_axis(ax)
        ax.set_xlabel(axis_label(key.split(".")[-1]) + ("" if "." not in key else f"  [{key}]"))
        ax.set_ylabel(axis_label(metric))
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    fig.suptitle(f"{title}\nheadline metrics against {key}", fontsize=10)
    return save(fig, path, legend=bool(series_cols))


def _legend(row: Mapping[str, Any], columns: Sequence[str]) -> str | None:
    """``policy=conservative`` for the columns that vary (not-swept values left out; a swept
    null is ``null``, as configs spell it)."""
    parts = [
        f"{c.split('.')[-1]}={_word(row[c])}" if c != "config" else str(row[c])
        for c in columns
        if row.get(c, _ABSENT) is not _ABSENT
    ]
    return ", ".join(parts) or None


def _word(value: Any) -> str:
    """A category as a config spells it: null, true, false, numbers and strings as they are."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return label(value)


def _log_scale(values: Sequence[float]) -> bool:
    """Positive values spanning 16x or more read better on a log axis (pool sizes, request pages)."""
    return min(values) > 0 and max(values) / min(values) >= 16


def _scalar(value: Any) -> Any:
    """A one-element list of a number counts as that number (``host_pages: [600]``)."""
    if isinstance(value, list) and len(value) == 1 and is_number(value[0]):
        return value[0]
    return value
