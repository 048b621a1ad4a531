"""The trace capacity curve as a PNG (needs matplotlib; imported lazily)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cpkv.plots.figures import figure, save
from cpkv.trace.stats import CurvePoint


def plot_capacity_curve(points: Sequence[CurvePoint], path: str | Path, title: str = "") -> Path:
    """Write hit % against cache capacity (% of the working set) to `path`; return the path.

    Draws the total hit and, when L2 is on at any point, the L1 and L2 shares.
    """
    xs = [p.capacity_pct for p in points]
    fig = figure(6, 4)
    ax = fig.subplots()
    ax.plot(xs, [p.cache_pct for p in points], marker="o", label="L1 + L2 hit")
    if any(p.l2_tokens for p in points):
        ax.plot(xs, [p.l1_hit_pct for p in points], marker=".", ls="--", label="L1 hit")
        ax.plot(xs, [p.l2_hit_pct for p in points], marker=".", ls=":", label="L2 hit")
    ax.set_xlabel("L1 capacity (% of the unlimited working set)")
    ax.set_ylabel("cached prompt tokens (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    return save(fig, Path(path))
