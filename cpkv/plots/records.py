"""Plots of one run, chosen by what its rows hold (any kind; matplotlib imported lazily).

* ``latency``: rows with ``request_pages`` and ``p50_*`` / ``p99_*`` metrics (the allocator
  benchmarks): p50 (solid) and p99 (dashed) against request pages, one panel per free-list
  pattern, one colour per impl and method; one file per value of any other varying column.
* ``per_tick``: rows with a ``tick`` column, or a ``ticks.jsonl`` beside results.json (the
  admission runs): every numeric per-tick field that changes (nested mappings such as
  budgets are flattened: ``budgets.rem_total_tokens``) against the tick, one panel per
  field, ``PANELS_PER_FILE`` panels a file (``per_tick.png``, ``per_tick_2.png``, ...: no
  field is dropped). More than ``BIN_OVER`` ticks are drawn binned: the mean of each bin
  as a line, its min..max as a band, so that thousands of ticks stay readable.
* ``capacity_curve``: ``cpkv trace curve`` runs: the hit ratio against cache capacity.
* ``serving``: serving runs (``timeline.jsonl``, ``requests.jsonl``): KV utilisation over time
  and the TTFT/TPOT CDFs.

The runner draws them into a run directory when asked (``--plots``, ``CPKV_PLOTS=1``);
``cpkv plot`` draws them for any saved run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cpkv.core.registry import Registry
from cpkv.plots.common import (
    all_integers,
    axis_label,
    file_stem,
    group_by,
    human_axis,
    integer_axis,
    is_number,
    label,
    varying,
)
from cpkv.plots.figures import figure, save, series_styles
from cpkv.runs.results import RunRecord

SERIES_COLUMNS = ("impl", "method", "backend", "policy")
CONTEXT_COLUMNS = ("op", "protocol", "device", "total_pages", "page_size", "cp_size")
"""Identity columns named in a latency plot's subtitle (what every line of it measured)."""
PANELS_PER_FILE = 12
BIN_OVER, BINS = 300, 150

Plotter = Callable[[RunRecord, Path, Path, str], list[Path]]
RUN_PLOTS: Registry[Plotter] = Registry("run plot")


@RUN_PLOTS.register("latency", help="allocator p50/p99 against request pages, per pattern and impl")
def latency(record: RunRecord, run_dir: Path, out: Path, title: str) -> list[Path]:
    rows = record.rows
    p50 = _first(record.columns.metrics, "p50_")
    p99 = _first(record.columns.metrics, "p99_")
    if not rows or "request_pages" not in record.columns.identity or not (p50 or p99):
        return []
    ident = [c for c in record.columns.identity if c != "request_pages"]
    moving = varying(rows, ident)
    facets = [c for c in moving if "pattern" in c]
    series = [c for c in moving if c in SERIES_COLUMNS]
    split = [c for c in moving if c not in facets and c not in series]
    context = [c for c in CONTEXT_COLUMNS if c in ident and c not in moving]
    paths = []
    for fig_rows in group_by(rows, split).values():
        fixed = {c: fig_rows[0].get(c) for c in split}
        shown = {**fixed, **{c: fig_rows[0].get(c) for c in context}}
        paths.append(_latency_figure(fig_rows, facets, series, (p50, p99), out / f"{file_stem('latency', fixed)}.png",
                                     _title(title, shown)))  # fmt: skip
    return paths


def _latency_figure(
    rows: list, facets: list[str], series: list[str], metrics: tuple, path: Path, title: str
) -> Path:
    """p50 (solid) and p99 (dashed) against request pages, one colour (and past ten, marker)
    per impl/method; with a single request size, bars instead (a line through one point
    shows nothing)."""
    from matplotlib.lines import Line2D

    panels = group_by(rows, facets)
    sizes = sorted({r["request_pages"] for r in rows})
    names = [
        " ".join(label(g[0].get(c)) for c in series) or "run"
        for g in group_by(rows, series).values()
    ]
    styles = dict(zip(names, series_styles(len(names)), strict=True))
    width = max(4.2, 0.55 * len(names) + 1.5) if len(sizes) == 1 else 4.2
    fig = figure(width * len(panels), 3.9)
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)
    stats = [(m, style) for m, style in zip(metrics, ("-", "--"), strict=True) if m]
    for ax, panel_rows in zip(axes[0], panels.values(), strict=True):
        groups = list(group_by(panel_rows, series).values())
        if len(sizes) == 1:
            for i, group in enumerate(groups):
                name = " ".join(label(group[0].get(c)) for c in series) or "run"
                for j, (metric, _) in enumerate(stats):
                    ax.bar(i + (j - 0.5) * 0.38 * (len(stats) > 1), group[0].get(metric), 0.36,
                           color=styles[name]["color"], alpha=1.0 if j == 0 else 0.45,
                           hatch=None if j == 0 else "//", edgecolor="white")  # fmt: skip
            ax.set_xticks(range(len(groups)), [" ".join(label(g[0].get(c)) for c in series) or "run" for g in groups],
                          rotation=25, ha="right", fontsize=8)  # fmt: skip
            ax.set_xlabel(f"request pages = {sizes[0]}")
        else:
            for group in groups:
                group = sorted(group, key=lambda r: r["request_pages"])
                name = " ".join(label(group[0].get(c)) for c in series) or "run"
                xs = [r["request_pages"] for r in group]
                for metric, style in stats:
                    ax.plot(
                        xs,
                        [r.get(metric) for r in group],
                        style,
                        marker=styles[name]["marker"],
                        ms=3,
                        color=styles[name]["color"],
                    )
            ticks = sorted({r["request_pages"] for r in panel_rows})
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.set_xlabel("request pages")
        ax.set_yscale("log")
        _plain_log_labels(ax)
        ax.set_title(
            ", ".join(f"{label(panel_rows[0].get(c))}" for c in facets) or "all rows", fontsize=9
        )
        ax.grid(True, which="both", alpha=0.3)
    unit = (metrics[0] or metrics[1]).rsplit("_", 1)[-1].replace("us", "µs")
    axes[0][0].set_ylabel(f"latency ({unit}, log scale)")
    if len(sizes) == 1:
        from matplotlib.patches import Patch

        handles = [Patch(color="grey", label=stats[0][0].split("_")[0])]
        if len(stats) > 1:
            handles.append(
                Patch(facecolor="grey", alpha=0.45, hatch="//", label=stats[1][0].split("_")[0])
            )
    else:
        handles = [
            Line2D([], [], color=styles[n]["color"], marker=styles[n]["marker"], ms=3, label=n)
            for n in names
        ]
        handles += [
            Line2D([], [], color="black", ls=style, label=m.split("_")[0]) for m, style in stats
        ]
    fig.suptitle(title, fontsize=10)
    return save(fig, path, legend=handles)


def tick_fields(
    record: RunRecord, run_dir: Path
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(rows, series columns, fields to plot) for the per-tick plot; no fields when it does not apply.

    Rows come from results.json when they have a ``tick``, else from ``ticks.jsonl``; nested
    mappings are flattened; fields must be numeric and change over the run.
    """
    rows = [r for r in record.rows if "tick" in r]
    ident: list[str] = [c for c in record.columns.identity if c != "tick"]
    if not rows and (run_dir / "ticks.jsonl").is_file():
        rows, ident = _read_jsonl(run_dir / "ticks.jsonl"), []
    rows = [_flatten(r) for r in rows if is_number(r.get("tick"))]
    fields = [
        k for k in dict.fromkeys(k for r in rows for k in r) if k != "tick" and k not in ident
    ]
    fields = [k for k in fields if all(is_number(r.get(k)) or r.get(k) is None for r in rows)]
    fields = [k for k in fields if len({r.get(k) for r in rows}) > 1]
    return rows, varying(rows, ident), fields


@RUN_PLOTS.register("per_tick", help="numeric per-tick fields (budgets, tokens) against the tick")
def per_tick(record: RunRecord, run_dir: Path, out: Path, title: str) -> list[Path]:
    rows, series, fields = tick_fields(record, run_dir)
    if not fields:
        return []
    pages = [fields[i : i + PANELS_PER_FILE] for i in range(0, len(fields), PANELS_PER_FILE)]
    paths = []
    for n, page in enumerate(pages, 1):
        name = "per_tick.png" if n == 1 else f"per_tick_{n}.png"
        part = f" (fields {n}/{len(pages)})" if len(pages) > 1 else ""
        paths.append(_per_tick_figure(rows, series, page, out / name, title + part))
    return paths


def _per_tick_figure(
    rows: list[dict[str, Any]], series: list[str], fields: list[str], path: Path, title: str
) -> Path:
    cols = 2 if len(fields) > 3 else 1
    nrows = math.ceil(len(fields) / cols)
    fig = figure(6.4 * cols, 2.3 * nrows + 0.9)
    axes = fig.subplots(nrows, cols, squeeze=False, sharex=True)
    lines = [sorted(line, key=lambda r: r["tick"]) for line in group_by(rows, series).values()]
    styles = series_styles(len(lines))
    binned = max(len(line) for line in lines) > BIN_OVER
    for ax, name in zip(axes.flat, fields, strict=False):
        for line, style in zip(lines, styles, strict=True):
            who = " ".join(label(line[0].get(c)) for c in series) or None
            points = [(r["tick"], r.get(name)) for r in line if is_number(r.get(name))]
            if not points:
                continue
            if binned:
                _binned(ax, points, who, style)
            else:
                xs, ys = zip(*points, strict=True)
                few = len(xs) <= 60  # a value per tick, not a curve: steps, each tick marked
                ax.plot(xs, ys, ms=3.5, lw=1, label=who, color=style["color"],
                        linestyle=style["linestyle"], marker=style["marker"] if few else None,
                        drawstyle="steps-mid" if few else "default")  # fmt: skip
        ax.set_title(axis_label(name), fontsize=9)
        integer_axis(ax, "x")
        if all_integers([r.get(name) for r in rows]):
            integer_axis(ax, "y")
        human_axis(ax)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(fields) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("tick")
    how = (
        f"\n{len(lines[0])} ticks: mean per bin of ~{max(1, len(lines[0]) // BINS)} (line), min..max (band)"
        if binned
        else ""
    )
    fig.suptitle(title + how, fontsize=10)
    return save(fig, path, legend=bool(series))


def _binned(
    ax: Any, points: list[tuple[Any, Any]], who: str | None, style: Mapping[str, Any]
) -> None:
    """The mean of each of BINS equal tick ranges as a line, their min..max as a band."""
    lo, hi = points[0][0], points[-1][0]
    width = max(1.0, (hi - lo + 1) / BINS)
    bins: dict[int, list[float]] = {}
    for tick, value in points:
        bins.setdefault(int((tick - lo) // width), []).append(float(value))
    keys = sorted(bins)
    xs = [lo + (k + 0.5) * width for k in keys]
    mean = [sum(bins[k]) / len(bins[k]) for k in keys]
    ax.plot(xs, mean, lw=1.1, label=who, color=style["color"], linestyle=style["linestyle"])
    ax.fill_between(xs, [min(bins[k]) for k in keys], [max(bins[k]) for k in keys],
                    color=style["color"], alpha=0.22, lw=0)  # fmt: skip


def plot_run(record: RunRecord, run_dir: Path, out: Path) -> list[Path]:
    """Every registered plot that applies to this run's rows; every title names the run (its
    directory: the time and name of a run, the index and name of a sweep point)."""
    title = f"{record.kind}: {Path(run_dir).name}"
    paths: list[Path] = []
    for name in RUN_PLOTS.names():
        paths.extend(RUN_PLOTS.get(name)(record, run_dir, out, title))
    return paths


def _plain_log_labels(ax: Any) -> None:
    """Log-axis labels as plain numbers (40, 100, 1000), not 4x10^1."""
    from matplotlib.ticker import FuncFormatter, LogFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def _first(names: Sequence[str], prefix: str) -> str | None:
    return next((n for n in names if n.startswith(prefix)), None)


def _title(title: str, fixed: Mapping[str, Any]) -> str:
    return title + ("\n" + ", ".join(f"{k}={label(v)}" for k, v in fixed.items()) if fixed else "")


def _flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            if isinstance(item, dict):
                rows.append(item)
    return rows


@RUN_PLOTS.register("capacity_curve", help="trace curve runs: hit ratio against cache capacity")
def capacity_curve(record: RunRecord, run_dir: Path, out: Path, title: str) -> list[Path]:
    if record.kind != "trace_curve" or not record.rows:
        return []
    import dataclasses

    from cpkv.plots.trace import plot_capacity_curve
    from cpkv.trace.stats import CurvePoint

    fields = [f.name for f in dataclasses.fields(CurvePoint)]
    points = [CurvePoint(**{k: row[k] for k in fields}) for row in record.rows]
    trace = Path(str(record.summary.get("trace", ""))).name
    name = f"{title}\n{trace}" if trace else title
    return [plot_capacity_curve(points, out / "capacity_curve.png", title=name)]


@RUN_PLOTS.register("serving", help="serving runs: KV utilisation over time, TTFT/TPOT CDFs")
def serving(record: RunRecord, run_dir: Path, out: Path, title: str) -> list[Path]:
    timeline, requests = run_dir / "timeline.jsonl", run_dir / "requests.jsonl"
    if record.kind != "admit" or not (timeline.is_file() and requests.is_file()):
        return []
    import json

    import yaml

    from cpkv.plots.serving import finished_latencies, plot_serving

    points = [json.loads(line) for line in timeline.read_text().splitlines() if line.strip()]
    ttft, tpot = finished_latencies(requests)
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    slo = (config.get("admit") or {}).get("slo")
    return plot_serving(out, points, {"ttft": ttft, "tpot": tpot}, title, slo)
