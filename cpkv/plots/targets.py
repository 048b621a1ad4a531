"""``cpkv plot``: PNGs for a run directory or a sweep directory."""

from __future__ import annotations

from pathlib import Path

from cpkv.capacity.store import load_result, resume_command
from cpkv.plots.capacity import plot_capacity, plot_frontier
from cpkv.plots.common import require_matplotlib
from cpkv.plots.records import plot_run
from cpkv.plots.sweep import plot_sweep
from cpkv.runs.rundir import load_run
from cpkv.sweep.listing import SweepView, open_target


def plot_target(
    path: str | Path, out: str | Path | None = None, *, points: bool = False
) -> list[Path]:
    """Write every plot that applies to ``path`` under ``out`` (default: ``<path>/plots``).

    For a sweep: headline metrics against swept keys, and with ``points=True`` each
    completed point's own plots under ``<out>/<point>/``; for a capacity search (a sweep
    directory with ``capacity.json``) its attainment and goodput curves first. A damaged
    ``summary.json`` or ``capacity.json`` is an InputError naming it, before any plot.
    """
    require_matplotlib()
    target = open_target(path)
    where = Path(out) if out is not None else Path(path) / "plots"
    if not isinstance(target, SweepView):
        return plot_run(target.record, target.path, where)
    search = load_result(Path(path))  # a capacity search: its own plot too
    summary = target.readable_summary(resume_command(Path(path)))
    paths = plot_sweep(summary, where, sweep_title(path))
    if search is not None:
        drawn = plot_capacity(search, where)
        if drawn is not None:
            paths.insert(0, drawn)
        frontier = plot_frontier(search, where) if search.get("frontier") else None
        if frontier is not None:
            paths.insert(1, frontier)
    if points:
        for point in target.plan.points:
            run_dir = target.point_dir(point.name)
            if (run_dir / "results.json").is_file():
                paths.extend(plot_run(load_run(run_dir).record, run_dir, where / point.name))
    return paths


def sweep_title(path: str | Path) -> str:
    """``sweep <its directory's name>``: the title of a sweep directory's plots."""
    return f"sweep {Path(path).resolve().name}"
