"""Plots of a serving run (needs matplotlib; imported lazily): KV utilisation over time and
the TTFT / TPOT CDFs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpkv.plots.common import pyplot, save


def plot_serving(
    folder: Path,
    points: Sequence[Mapping[str, float]],
    latencies: Sequence[Mapping[str, Any]],
    title: str = "",
    slo: Mapping[str, float | None] | None = None,
) -> list[Path]:
    """Write ``kv_utilization.png`` and ``latency_cdf.png`` (with the SLO limits as dashed
    lines, ``slo``: ``ttft_ms``/``tpot_ms``) into ``folder``; returns the paths."""
    plt = pyplot()
    out = []
    fig, ax = plt.subplots(figsize=(8.2, 3.6))
    instances = sorted({p["instance"] for p in points if "instance" in p})
    if instances:  # a cluster: one series per instance (admit.cluster)
        for k in instances:
            mine = [p for p in points if p.get("instance") == k]
            ax.plot([p["t_s"] for p in mine], [p["kv_used_mean_pct"] for p in mine], lw=1,
                    label=f"instance {k}, used (mean)")  # fmt: skip
    else:
        xs = [p["t_s"] for p in points]
        ax.plot(xs, [p["kv_used_mean_pct"] for p in points], label="used (mean)")
        ax.plot(xs, [p["kv_used_peak_pct"] for p in points], lw=0.8, ls=":", label="used (peak)")
        if any(p["kv_held_mean_pct"] != p["kv_used_mean_pct"] for p in points):
            ax.plot(xs, [p["kv_held_mean_pct"] for p in points], ls="--", label="held (reserved)")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV pool (%)")
    ax.set_ylim(0, 105)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.set_title(f"{title}: KV pool utilisation" if title else "KV pool utilisation", fontsize=10)
    out.append(save(fig, folder / "kv_utilization.png"))

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in zip(axes, ("ttft", "tpot"), ("TTFT (ms)", "TPOT (ms)"), strict=True):
        values = sorted(x[key] for x in latencies if x[key] is not None)
        if values:
            n = len(values)
            ax.step(values, [(k + 1) / n for k in range(n)], where="post")
        limit = (slo or {}).get(f"{key}_ms")
        if limit is not None:
            ax.axvline(limit, color="tab:red", ls="--", lw=1, label=f"SLO {limit:g} ms")
            ax.legend(loc="lower right")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{title}: latency CDFs" if title else "latency CDFs", fontsize=10)
    out.append(save(fig, folder / "latency_cdf.png"))
    return out
