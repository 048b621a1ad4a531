"""Many series stay apart: no two lines share a (colour, line style) pair past ten series,
and the legend stands beside the panels, never over the data."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpkv.plots import sweep
from cpkv.plots.figures import series_styles

pytest.importorskip("matplotlib")


def test_more_than_ten_series_get_distinct_colour_and_style_pairs() -> None:
    few = series_styles(10)
    assert len({s["color"] for s in few}) == 10 and {s["linestyle"] for s in few} == {"-"}
    many = series_styles(40)
    assert len({(s["color"], s["linestyle"]) for s in many}) == 40
    assert many[10]["color"] == many[0]["color"] and many[10]["linestyle"] != "-"
    most = series_styles(120)
    assert len({(s["color"], s["linestyle"], s["marker"]) for s in most}) == 120


def policies_sweep(n: int = 13) -> dict:
    """``n`` policies at two loads, four headline metrics (made-up numbers)."""
    points = []
    for i in range(n):
        for j, speed in enumerate((0.3, 0.5)):
            points.append({"name": f"{2 * i + j:03d}_p", "config_name": "p", "status": "complete",
                           "swept": {"admit.policy": f"policy-{i}", "admit.arrivals.speedup": speed},
                           "headline": {"goodput_requests_per_s": 1.0 + i / 10 + j,
                                        "ttft_p50_ms": 100.0 * (i + 1) * (j + 1),
                                        "ttft_p99_ms": 900.0 * (i + 1) * (j + 1),
                                        "tpot_p50_ms": 10.0 + i + 5 * j}})  # fmt: skip
    return {"name": "p", "swept_keys": ["admit.policy", "admit.arrivals.speedup"], "points": points}


def test_thirteen_policies_are_told_apart_by_a_legend_beside_the_panels(
    tmp_path: Path, figures
) -> None:
    sweep.plot_sweep(policies_sweep(), tmp_path, "sweep policies")
    fig = figures["sweep_admit.arrivals.speedup.png"]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 4
    for ax in panels:
        lines = ax.get_lines()
        assert len(lines) == 13
        assert len({(line.get_color(), line.get_linestyle()) for line in lines}) == 13
        assert ax.get_legend() is None  # no legend inside any panel
    (legend,) = fig.legends
    assert len(legend.get_texts()) == 13
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    assert box.x1 <= fig.bbox.x1 + 1  # inside the figure
    for ax in panels:
        assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_ylabel()
    assert fig.get_layout_engine() is None  # laid out once: savefig does not lay it out again


def test_a_legend_taller_than_the_figure_takes_more_columns(tmp_path: Path, figures) -> None:
    summary = policies_sweep(40)
    summary["points"] = [
        {**p, "headline": {"goodput_requests_per_s": p["headline"]["goodput_requests_per_s"]}}
        for p in summary["points"]
    ]  # one panel: a short figure
    sweep.plot_sweep(summary, tmp_path, "sweep policies")
    fig = figures["sweep_admit.arrivals.speedup.png"]
    (legend,) = fig.legends
    assert legend._ncols > 1
    box = legend.get_window_extent(fig.canvas.get_renderer())
    assert box.y0 >= fig.bbox.y0 - 1 and box.y1 <= fig.bbox.y1 + 1
    (ax,) = fig.axes
    assert not box.overlaps(ax.get_window_extent(fig.canvas.get_renderer()))


def test_every_line_is_named_a_swept_null_too(tmp_path: Path, figures) -> None:
    points = [
        {"name": f"{i:03d}_a", "config_name": "a", "status": "complete",
         "swept": {"a.tokens": tokens, "a.chunk": chunk}, "headline": {"ticks": i}}
        for i, (tokens, chunk) in enumerate((t, c) for t in (1, 2) for c in (None, 2048))
    ]  # fmt: skip
    sweep.plot_sweep(
        {"name": "a", "swept_keys": ["a.tokens", "a.chunk"], "points": points}, tmp_path
    )
    (legend,) = figures["sweep_a.tokens.png"].legends
    assert [t.get_text() for t in legend.get_texts()] == ["chunk=null", "chunk=2048"]
