"""Plots of a serving run (needs matplotlib; imported lazily): KV utilisation over time and
the TTFT / TPOT CDFs.

A run of a million requests has a ``requests.jsonl`` of hundreds of megabytes: its latencies
are read a chunk at a time (:func:`finished_latencies`: two numbers of each finished
request's line, nothing else kept), and a CDF of more than :data:`CDF_POINTS` values is
drawn through :data:`CDF_POINTS` of its order statistics (evenly spaced ranks, the first and
the last included): the curve a reader sees, without a million steps to render.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpkv.plots.figures import figure, save

CDF_POINTS = 4000
"""Most points a latency CDF is drawn through."""
CHUNK_BYTES = 1 << 24
_STATUS = re.compile(rb'"status":"(\w+)"')
_LATENCY = re.compile(rb'"ttft_ms":(null|[-+.\deE]+),"tpot_ms":(null|[-+.\deE]+)')
"""Two fields of a ``requests.jsonl`` line as the serving run writes it (once a line: a
string value holds no unescaped quote)."""


def finished_latencies(path: Path) -> tuple[array, array]:
    """TTFT and TPOT (ms) of the finished requests of a ``requests.jsonl`` (TPOT: those that
    have one), read a chunk at a time; lines in another layout are parsed as JSON."""
    ttft, tpot = array("d"), array("d")
    with path.open("rb") as f:
        rest = b""
        while True:
            block = f.read(CHUNK_BYTES)
            data = rest + block
            if block:
                cut = data.rfind(b"\n") + 1
                data, rest = data[:cut], data[cut:]
            if data:
                _take(data, ttft, tpot)
            if not block:
                return ttft, tpot


def _take(data: bytes, ttft: array, tpot: array) -> None:
    statuses = _STATUS.findall(data)
    pairs = _LATENCY.findall(data)
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    if len(statuses) == len(pairs) == lines:
        for status, (first, per) in zip(statuses, pairs, strict=True):
            if status == b"finished":
                ttft.append(float(first))
                if per != b"null":
                    tpot.append(float(per))
        return
    for line in data.splitlines():  # another layout: JSON, line by line
        if line.strip():
            r = json.loads(line)
            if r["status"] == "finished":
                ttft.append(r["ttft_ms"])
                if r["tpot_ms"] is not None:
                    tpot.append(r["tpot_ms"])


def cdf_steps(values: Sequence[float]) -> tuple[Any, Any]:
    """``(x, fraction)`` of the empirical CDF of ``values``: every order statistic, or
    :data:`CDF_POINTS` of them at evenly spaced ranks (the first and the last included)."""
    import numpy as np

    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    ranks = (
        np.arange(n)
        if n <= CDF_POINTS
        else np.unique(np.linspace(0, n - 1, CDF_POINTS).round().astype(np.int64))
    )
    return ordered[ranks], (ranks + 1) / n


def plot_serving(
    folder: Path,
    points: Sequence[Mapping[str, float]],
    latencies: Mapping[str, Sequence[float]],
    title: str = "",
    slo: Mapping[str, float | None] | None = None,
) -> list[Path]:
    """Write ``kv_utilization.png`` and ``latency_cdf.png`` (``latencies``: the finished
    requests' ``ttft`` and ``tpot`` values in ms; the SLO limits as dashed lines, ``slo``:
    ``ttft_ms``/``tpot_ms``) into ``folder``; returns the paths."""
    out = []
    fig = figure(8.2, 3.6)
    ax = fig.subplots()
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

    fig = figure(9, 3.6)
    axes = fig.subplots(1, 2)
    for ax, key, label in zip(axes, ("ttft", "tpot"), ("TTFT (ms)", "TPOT (ms)"), strict=True):
        values: Any = latencies.get(key) or ()
        if len(values):
            xs_cdf, fractions = cdf_steps(values)
            ax.step(xs_cdf, fractions, where="post")
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
