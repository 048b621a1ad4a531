"""Plots a person can read, checked on the figures themselves (kept as they are written):
titles name the run or sweep, axes name their units, legends name only what varies, numeric
axes stay numeric, integer axes show integers, thousands of ticks are binned, no panel is
dropped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cpkv.plots import records, sweep
from cpkv.runs.rundir import load_run
from tests.helpers.paths import SAVED_RUNS

pytest.importorskip("matplotlib")


def title(fig) -> str:
    return fig._suptitle.get_text() if fig._suptitle is not None else ""


def legend_texts(fig) -> list[str]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def long_admission_run(tmp_path: Path, ticks: int = 2000) -> Path:
    """The hand-made admission run, stretched to ``ticks`` ticks (made-up numbers)."""
    run = tmp_path / "07-00-00-000000_long-run"
    shutil.copytree(SAVED_RUNS / "admit_ticks", run)
    doc = json.loads((run / "results.json").read_text())
    template = doc["rows"][0]
    doc["rows"] = [{**template, "tick": t, "accepted": 1 + t % 7, "extend_tokens": 100 * (t % 13),
                    "rem_tokens": 5000 - t} for t in range(ticks)]  # fmt: skip
    (run / "results.json").write_text(json.dumps(doc))
    return run


def test_thousands_of_ticks_are_binned_and_integers_stay_integers(tmp_path: Path, figures) -> None:
    run = long_admission_run(tmp_path)
    rec = load_run(run).record
    records.plot_run(rec, run, tmp_path / "plots")
    fig = figures["per_tick.png"]
    assert title(fig).startswith("admit: 07-00-00-000000_long-run")  # names the run
    assert "2000 ticks: mean per bin" in title(fig)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        (line,) = ax.get_lines()
        assert len(line.get_xdata()) <= records.BINS  # binned: a line, not a band of 2000 points
        assert ax.collections  # the min..max band
        assert ax.get_xlabel() in ("", "tick")
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)  # never 1.5
    assert {ax.get_title() for ax in fig.axes} == {"accepted", "extend (tokens)", "rem (tokens)"}


def test_no_field_is_dropped(tmp_path: Path, figures) -> None:
    run = long_admission_run(tmp_path, ticks=30)
    doc = json.loads((run / "results.json").read_text())
    for row in doc["rows"]:
        row.update({f"extra_{i}_tokens": row["tick"] * i for i in range(1, 15)})
    (run / "results.json").write_text(json.dumps(doc))
    paths = records.per_tick(load_run(run).record, run, tmp_path, "admit: x")
    assert [p.name for p in paths] == ["per_tick.png", "per_tick_2.png"]
    panels = [ax.get_title() for f in figures.values() for ax in f.axes if ax.get_visible()]
    assert len(panels) == 17  # 3 fields + 14 extra, over two files
    assert "(fields 2/2)" in title(figures["per_tick_2.png"])


def test_allocator_latency_names_the_run_and_its_units(tmp_path: Path, figures) -> None:
    run = SAVED_RUNS / "host_base"
    records.plot_run(load_run(run).record, run, tmp_path)
    fig = figures["latency.png"]
    assert title(fig).startswith("alloc_host: host_base\n") and "op=alloc" in title(fig)
    assert fig.axes[0].get_ylabel() == "latency (µs, log scale)"
    # one request size: bars per impl/method, a legend of the statistics only
    assert legend_texts(fig) == ["p50", "p99"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["fifo", "contiguous"]


def mixed_sweep() -> dict:
    """Two configs of different kinds: `a.pages` swept only in config a, `b.speed` only in b."""
    points = []
    for i, pages in enumerate((1024, 4096, 16384)):
        for j, proto in enumerate(("cold", "warm")):
            points.append({"name": f"{2 * i + j:03d}_a", "config_name": "a", "kind": "alloc_host", "status": "complete",
                           "swept": {"a.pages": [pages], "a.protocol": proto},
                           "headline": {"gmean_p50_us": pages / 100 + j, "median_vs_fifo_p99": 2.0}})  # fmt: skip
    for k, speed in enumerate((0.5, 0.8, 1.0, None)):
        points.append({"name": f"{6 + k:03d}_b", "config_name": "b", "kind": "admit", "status": "complete",
                       "swept": {"b.speed": speed},
                       "headline": {f"m{n}_ms": speed or 0.0 for n in range(8)}})  # fmt: skip
    return {"name": "mixed", "swept_keys": ["a.pages", "a.protocol", "b.speed"], "points": points}


def test_sweep_plots_keep_each_key_to_its_own_points(tmp_path: Path, figures) -> None:
    paths = sweep.plot_sweep(mixed_sweep(), tmp_path, "sweep 07-00_sweep-mixed")
    assert [p.name for p in paths] == [
        "sweep_a.pages.png", "sweep_a.protocol.png", "sweep_b.speed.png", "sweep_b.speed_2.png",
    ]  # fmt: skip
    pages = figures["sweep_a.pages.png"]
    assert title(pages).startswith("sweep 07-00_sweep-mixed\n")
    # only config a's metrics, numeric pages on a log2 axis, a legend of what varies there
    assert [ax.get_ylabel() for ax in pages.axes] == ["gmean p50 (µs)", "median vs fifo p99 (x)"]
    assert pages.axes[0].get_xscale() == "log"
    assert set(legend_texts(pages)) == {"protocol=cold", "protocol=warm"}
    assert not any("None" in t or "null" in t for t in legend_texts(pages))
    # b.speed holds a null: categorical, spelled as configs spell it, and 8 metrics on 2 files
    speed = figures["sweep_b.speed.png"]
    labels = [t.get_text() for t in speed.axes[0].get_xticklabels()]
    assert labels == ["0.5", "0.8", "1.0", "null"]
    n_panels = sum(
        ax.get_visible() for f in (speed, figures["sweep_b.speed_2.png"]) for ax in f.axes
    )
    assert n_panels == 8
    assert legend_texts(speed) == []  # nothing else varies among b's points
