"""Plots of one run, chosen by what its rows hold (any kind; matplotlib imported lazily).

* ``latency``: rows with ``request_pages`` and ``p50_*`` / ``p99_*`` metrics (the allocator
  benchmarks): p50 (solid) and p99 (dashed) against request pages, one panel per free-list
  pattern, one colour per impl and method; one file per value of any other varying column.
* ``per_tick``: rows with a ``tick`` column, or a ``ticks.jsonl`` beside results.json (the
  admission runs): every numeric per-tick field (nested mappings such as budgets are
  flattened: ``budgets.rem_total_tokens``) against the tick, one panel per field.
* ``capacity_curve``: ``cpkv trace curve`` runs: the hit ratio against cache capacity.
* ``serving``: serving runs (``timeline.jsonl``, ``requests.jsonl``): KV utilisation over time
  and the TTFT/TPOT CDFs.

The runner draws them into every run directory when matplotlib is installed; ``cpkv plot``
draws them again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cpkv.core.registry import Registry
from cpkv.plots.common import file_stem, group_by, is_number, label, pyplot, save, varying
from cpkv.runs.results import RunRecord

SERIES_COLUMNS = ("impl", "method", "backend", "policy")
MAX_PANELS = 12

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
    paths = []
    for fig_rows in group_by(rows, split).values():
        fixed = {c: fig_rows[0].get(c) for c in split}
        paths.append(_latency_figure(fig_rows, facets, series, (p50, p99), out / f"{file_stem('latency', fixed)}.png",
                                     _title(title, fixed)))  # fmt: skip
    return paths


def _latency_figure(
    rows: list, facets: list[str], series: list[str], metrics: tuple, path: Path, title: str
) -> Path:
    plt = pyplot()
    panels = group_by(rows, facets)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.2 * len(panels) + 1.2, 3.8), squeeze=False, sharey=True
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel_rows in zip(axes[0], panels.values(), strict=True):
        for i, line_rows in enumerate(group_by(panel_rows, series).values()):
            line_rows = sorted(line_rows, key=lambda r: r["request_pages"])
            xs = [r["request_pages"] for r in line_rows]
            name = " ".join(label(line_rows[0].get(c)) for c in series) or "run"
            for metric, style in zip(metrics, ("-", "--"), strict=True):
                if metric:
                    ax.plot(xs, [r.get(metric) for r in line_rows], style, marker="o", ms=3,
                            color=colours[i % len(colours)], label=f"{name} {metric.split('_')[0]}")  # fmt: skip
        ticks = sorted({r["request_pages"] for r in panel_rows})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_yscale("log")
        _plain_log_labels(ax)
        ax.set_xlabel("request pages")
        ax.set_title(
            ", ".join(f"{label(panel_rows[0].get(c))}" for c in facets) or "all rows", fontsize=9
        )
        ax.grid(True, which="both", alpha=0.3)
    unit = (metrics[0] or metrics[1]).rsplit("_", 1)[-1]
    axes[0][0].set_ylabel(f"latency ({unit}, log scale)")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    return save(fig, path)


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
    fields = [k for k in fields if len({r.get(k) for r in rows}) > 1][:MAX_PANELS]
    return rows, varying(rows, ident), fields


@RUN_PLOTS.register("per_tick", help="numeric per-tick fields (budgets, tokens) against the tick")
def per_tick(record: RunRecord, run_dir: Path, out: Path, title: str) -> list[Path]:
    rows, series, fields = tick_fields(record, run_dir)
    if not fields:
        return []
    plt = pyplot()
    cols = 2 if len(fields) > 3 else 1
    nrows = math.ceil(len(fields) / cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(6.0 * cols, 2.2 * nrows + 0.8), squeeze=False, sharex=True
    )
    for ax, name in zip(axes.flat, fields, strict=False):
        for line in group_by(rows, series).values():
            line = sorted(line, key=lambda r: r["tick"])
            who = " ".join(label(line[0].get(c)) for c in series)
            ax.plot(
                [r["tick"] for r in line],
                [r.get(name) for r in line],
                marker=".",
                ms=4,
                label=who or None,
            )
        ax.set_title(name, fontsize=9)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(fields) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("tick")
    if series:
        axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return [save(fig, out / "per_tick.png")]


def plot_run(record: RunRecord, run_dir: Path, out: Path) -> list[Path]:
    """Every registered plot that applies to this run's rows."""
    title = f"{record.kind}: {record.name}"
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
    name = Path(str(record.summary.get("trace", ""))).name or title
    return [plot_capacity_curve(points, out / "capacity_curve.png", title=name)]


@RUN_PLOTS.register("serving", help="serving runs: KV utilisation over time, TTFT/TPOT CDFs")
def serving(record: RunRecord, run_dir: Path, out: Path, title: str) -> list[Path]:
    timeline, requests = run_dir / "timeline.jsonl", run_dir / "requests.jsonl"
    if record.kind != "admit" or not (timeline.is_file() and requests.is_file()):
        return []
    import json

    import yaml

    from cpkv.plots.serving import plot_serving

    points = [json.loads(line) for line in timeline.read_text().splitlines() if line.strip()]
    finished = [json.loads(line) for line in requests.read_text().splitlines() if line.strip()]
    lat = [
        {"ttft": r["ttft_ms"], "tpot": r["tpot_ms"]} for r in finished if r["status"] == "finished"
    ]
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    slo = (config.get("admit") or {}).get("slo")
    return plot_serving(out, points, lat, title, slo)
