"""Plots of a sweep: each headline metric against each swept key (matplotlib imported lazily).

One PNG per swept key (``sweep_<key>.png``), one panel per headline metric, one line per
combination of the other swept values (and config). A numeric key (or a one-element list
of a number, as ``host_pages: [600]``) is a numeric axis; any other key is categorical.
Only completed points are drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpkv.plots.common import file_stem, group_by, is_number, label, pyplot, save

MAX_PANELS = 6


def plot_sweep(summary: Mapping[str, Any], out: Path) -> list[Path]:
    """PNGs of ``summary.json``'s headline metrics against every swept key."""
    points = [
        p
        for p in summary.get("points") or []
        if p.get("status") == "complete" and p.get("headline")
    ]
    keys = list(summary.get("swept_keys") or [])
    metrics = list(dict.fromkeys(m for p in points for m in p["headline"]))[:MAX_PANELS]
    if not points or not metrics:
        return []
    rows = [{**{k: _scalar((p.get("swept") or {}).get(k)) for k in keys}, "config": p.get("config_name"),
             **p["headline"]} for p in points]  # fmt: skip
    return [_figure(rows, key, [k for k in keys if k != key], metrics, summary, out) for key in keys
            if len({label(r[key]) for r in rows}) > 1]  # fmt: skip


def _figure(
    rows: list[dict], key: str, others: list[str], metrics: list[str], summary: Mapping, out: Path
) -> Path:
    plt = pyplot()
    numeric = all(is_number(r[key]) for r in rows)
    categories = list(dict.fromkeys(label(r[key]) for r in rows))
    series_cols = [c for c in ["config", *others] if len({label(r.get(c)) for r in rows}) > 1]
    cols = 2 if len(metrics) > 1 else 1
    nrows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 3.4 * nrows + 0.6), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for line in group_by(rows, series_cols).values():
            line = [r for r in line if is_number(r.get(metric))]
            if numeric:
                line.sort(key=lambda r: r[key])
                xs: Sequence[Any] = [r[key] for r in line]
            else:
                xs = [categories.index(label(r[key])) for r in line]
            name = (
                ", ".join(f"{c.split('.')[-1]}={label(line[0].get(c))}" for c in series_cols)
                if line
                else ""
            )
            ax.plot(xs, [r[metric] for r in line], marker="o", ms=4, label=name or None)
        if not numeric:
            ax.set_xticks(range(len(categories)), categories, rotation=20, fontsize=8)
        elif _log_scale([r[key] for r in rows]):
            ticks = sorted({r[key] for r in rows})
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks], fontsize=8)
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
        if series_cols:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    fig.suptitle(f"sweep {summary.get('name')}: headline metrics against {key}", fontsize=10)
    return save(fig, out / f"{file_stem('sweep_' + key, {})}.png")


def _log_scale(values: Sequence[float]) -> bool:
    """Positive values spanning 16x or more read better on a log axis (pool sizes, request pages)."""
    return min(values) > 0 and max(values) / min(values) >= 16


def _scalar(value: Any) -> Any:
    """A one-element list of a number counts as that number (``host_pages: [600]``)."""
    if isinstance(value, list) and len(value) == 1 and is_number(value[0]):
        return value[0]
    return value
