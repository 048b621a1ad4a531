"""The plot of a capacity search: SLO attainment and goodput against the offered load.

Two panels side by side, one line per value of the second axis (its points sorted by load):
the SLO attainment (%) with the target as a dashed line, and the goodput (requests/s meeting
the SLO). The x axis is the offered load in requests per second when every point knows it
(from its arrival times), else the searched key itself; it turns logarithmic when the points
span 16x or more. Each search's capacity is a dotted vertical line with a marker, labelled in
the legend, which stands beside the panels.

A search of deployments (``capacity.gpus``) adds ``frontier.png``: each deployment's capacity
(offered requests/s when known) against its GPUs, disaggregated deployments and colocated
ones marked apart and named, the best deployment per GPU count joined by a line (the
frontier), and the target load as a dashed line with the cheapest deployment that reaches
it ringed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cpkv.capacity.store import PLOT_FILE
from cpkv.plots.common import axis_label, is_number
from cpkv.plots.figures import figure, save, series_styles

LOG_SPAN = 16.0
FRONTIER_FILE = "frontier.png"


def plot_capacity(doc: Mapping[str, Any], out: Path) -> Path | None:
    """Write ``out/capacity.png`` from a capacity.json document; None when no point finished."""
    searches = [s for s in doc.get("searches") or [] if _finished(s)]
    if not searches:
        return None
    offered = all(
        is_number(p.get("offered_requests_per_s")) for s in searches for p in _finished(s)
    )
    x_key = "offered_requests_per_s" if offered else "load"
    load_key = str(doc.get("load_key", "load"))
    axis_key = doc.get("axis_key")
    fig = figure(10.0, 4.4)
    ax_att, ax_good = fig.subplots(1, 2)
    xs_all = []
    for s, style in zip(searches, series_styles(len(searches)), strict=True):
        color = style["color"]
        points = sorted(_finished(s), key=lambda p: p["load"])
        xs = [p[x_key] for p in points]
        xs_all.extend(xs)
        name = f"{axis_key.split('.')[-1]}={s.get('label')}" if axis_key else "search"
        capacity = s.get("capacity_load")
        at = next((p for p in points if p["load"] == capacity), None)
        if at is not None:
            where = at[x_key]
            unit = " req/s" if offered else f" ({load_key.split('.')[-1]})"
            name += f": capacity {where:.3g}{unit}"
        ax_att.plot(xs, [p["attainment_pct"] for p in points], ms=4, label=name, **style)
        goodput = [p.get("goodput_requests_per_s") for p in points]
        pairs = [(x, g) for x, g in zip(xs, goodput, strict=True) if is_number(g)]
        if pairs:
            ax_good.plot(*zip(*pairs, strict=True), ms=4, label=name, **style)
        if at is not None:
            for ax, y in (
                (ax_att, at["attainment_pct"]),
                (ax_good, at.get("goodput_requests_per_s")),
            ):
                ax.axvline(at[x_key], color=color, linestyle=":", linewidth=1.2)
                if is_number(y):
                    ax.plot([at[x_key]], [y], marker="*", ms=13, color=color, zorder=5)
    target = doc.get("target_attainment_pct")
    if is_number(target):
        ax_att.axhline(
            target, color="0.4", linestyle="--", linewidth=1, label=f"target {target:g}%"
        )
    x_label = (
        "offered load (requests/s)"
        if offered
        else f"{axis_label(load_key.split('.')[-1])}  [{load_key}]"
    )
    positive = [x for x in xs_all if x > 0]
    for ax in (ax_att, ax_good):
        ax.set_xlabel(x_label)
        ax.grid(True, alpha=0.3)
        if positive and max(positive) / min(positive) >= LOG_SPAN:
            ax.set_xscale("log")
    ax_att.set_ylabel("SLO attainment (%)")
    ax_att.set_ylim(-3, 103)
    ax_good.set_ylabel("goodput (requests/s)")
    ax_good.set_ylim(bottom=0)
    slo = ", ".join(f"{k} {v:g}" for k, v in (doc.get("slo") or {}).items() if v is not None)
    tol = 100 * float(doc.get("tolerance") or 0)
    shown = f"{target:g}%" if is_number(target) else "the target"
    fig.suptitle(
        f"capacity {doc.get('name')}: the highest load with >= {shown} of requests within "
        f"the SLO ({slo}), to {tol:g}%\n(stars: the capacity found; dotted: its load)",
        fontsize=10,
    )
    return save(fig, out / PLOT_FILE, legend=True)


def _finished(search: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        p
        for p in search.get("points") or []
        if is_number(p.get("attainment_pct")) and is_number(p.get("load"))
    ]


def plot_frontier(doc: Mapping[str, Any], out: Path) -> Path | None:
    """Write ``out/frontier.png`` from a capacity.json document of a deployments search;
    None when it has no frontier or no capacity was found."""
    frontier = doc.get("frontier")
    searches = [
        s for s in doc.get("searches") or []
        if is_number(s.get("capacity_load")) and is_number(s.get("gpus"))
    ]  # fmt: skip
    if not frontier or not searches:
        return None
    offered = all(is_number(s.get("capacity_offered_requests_per_s")) for s in searches)
    key = "capacity_offered_requests_per_s" if offered else "capacity_load"
    fig = figure(7.5, 4.6)
    ax = fig.subplots(1, 1)
    for colocated, style in ((False, {"marker": "o", "color": "#1f77b4"}),
                             (True, {"marker": "s", "color": "#ff7f0e"})):  # fmt: skip
        mine = [
            s for s in searches if str(s.get("deployment", "")).endswith("colocated") == colocated
        ]
        if not mine:
            continue
        ax.plot([s["gpus"] for s in mine], [s[key] for s in mine], linestyle="none", ms=7,
                label="colocated" if colocated else "disaggregated (xPyD)", **style)  # fmt: skip
        for s in mine:  # (colocated names to the left, the splits' to the right)
            ax.annotate(str(s.get("deployment")), (s["gpus"], s[key]), textcoords="offset points",
                        xytext=(-7, 3) if colocated else (6, 3), fontsize=8,
                        ha="right" if colocated else "left")  # fmt: skip
    best = [(x["gpus"], x.get(key.removeprefix("capacity_")) if offered else x["capacity_load"])
            for x in frontier.get("best_per_gpus") or []]  # fmt: skip
    best = [(g, y) for g, y in best if is_number(y)]
    if best:
        ax.plot(*zip(*best, strict=True), color="0.3", linewidth=1.2, label="best per GPU count")
    load_label = str(doc.get("load_key", "load")).split(".")[-1]
    target, cheap = frontier.get("target_load"), frontier.get("cheapest")
    if is_number(target) and not offered:
        ax.axhline(target, color="0.4", linestyle="--", linewidth=1, label=f"target {target:g}")
    if cheap is not None:
        at = next((s for s in searches if s.get("deployment") == cheap["deployment"]
                   and s.get("gpus") == cheap["gpus"]), None)  # fmt: skip
        if at is not None:
            ax.plot([at["gpus"]], [at[key]], marker="o", ms=16, markerfacecolor="none",
                    markeredgecolor="#d62728", linestyle="none",
                    label=f"cheapest for {load_label} {target:g}: {cheap['deployment']}")  # fmt: skip
    gpus = sorted({s["gpus"] for s in searches})
    ax.set_xticks(gpus)
    pad = max(1.0, 0.15 * (gpus[-1] - gpus[0]))  # room for the names on either side
    ax.set_xlim(gpus[0] - pad, gpus[-1] + pad)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("capacity: offered load (requests/s)" if offered else f"capacity ({load_label})")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    target_pct = doc.get("target_attainment_pct")
    shown = f"{target_pct:g}%" if is_number(target_pct) else "the target"
    fig.suptitle(
        f"capacity {doc.get('name')}: the highest load with >= {shown} of requests within "
        "the SLO, per deployment",
        fontsize=10,
    )
    return save(fig, out / FRONTIER_FILE, legend=True)
