"""`cpkv plot`: which PNGs a run or a sweep gets, and a clear error without matplotlib."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from cpkv.plots.records import tick_fields
from cpkv.plots.sweep import plot_sweep
from cpkv.runs.rundir import load_run
from tests.helpers.paths import SAVED_RUNS

pytest.importorskip("matplotlib")

DATA = SAVED_RUNS
PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def host_grid(tmp_path: Path) -> Path:
    """An alloc_host run: 2 pools x 2 patterns x 2 methods x 3 request sizes (made up numbers)."""
    run = tmp_path / "run"
    shutil.copytree(DATA / "host_base", run)
    doc = json.loads((run / "results.json").read_text())
    template = doc["rows"][0]
    doc["rows"] = [
        {**template, "total_pages": pool, "pattern": pat, "method": m, "request_pages": req,
         "p50_us": 1.0 + req, "p99_us": 2.0 + req}
        for pool in (600, 1200) for pat in ("contiguous_fifo", "random_fragmented")
        for m in ("fifo", "contiguous") for req in (1, 8, 64)
    ]  # fmt: skip
    (run / "results.json").write_text(json.dumps(doc))
    return run


def test_allocator_latency_one_file_per_pool_one_panel_per_pattern(cli, tmp_path: Path) -> None:
    run = host_grid(tmp_path)
    res = cli("plot", str(run), output=False)
    assert res.exit_code == 0, res.output
    paths = [Path(p) for p in res.output.split()]
    assert [p.name for p in paths] == [
        "latency_total_pages=600.png",
        "latency_total_pages=1200.png",
    ]
    assert all(p.parent == run / "plots" for p in paths)
    one_panel = tmp_path / "one"
    res = cli("plot", str(DATA / "host_base"), "-o", str(one_panel), output=False)
    (single,) = [Path(p) for p in res.output.split()]
    assert single.name == "latency.png"
    assert png_size(paths[0])[0] > 1.5 * png_size(single)[0]  # two pattern panels side by side


def test_per_tick_fields_from_rows_and_from_ticks_jsonl(cli, tmp_path: Path) -> None:
    admit = DATA / "admit_ticks"
    rows, series, fields = tick_fields(load_run(admit).record, admit)
    assert fields == ["accepted", "extend_tokens", "rem_tokens"] and series == [] and len(rows) == 3
    res = cli("plot", str(admit), "-o", str(tmp_path / "p"), output=False)
    (path,) = [Path(p) for p in res.output.split()]
    assert (
        path.name == "per_tick.png" and png_size(path)[1] > png_size(path)[0] * 0.8
    )  # three stacked panels
    # rows without a tick: the plot reads ticks.jsonl, flattening the budgets mapping
    run = tmp_path / "run"
    shutil.copytree(admit, run)
    doc = json.loads((run / "results.json").read_text())
    doc["rows"] = []
    (run / "results.json").write_text(json.dumps(doc))
    rows, _, fields = tick_fields(load_run(run).record, run)
    assert fields == ["accepted", "budgets.rem_total_tokens", "budgets.rem_input_tokens"]
    assert [r["budgets.rem_input_tokens"] for r in rows] == [
        16384 - 4096,
        16384 - 6144,
        16384 - 2048,
    ]


def test_sweep_metric_against_each_swept_key(tmp_path: Path) -> None:
    points = [
        {"name": f"{i:03d}_x", "config_name": "x", "status": status, "swept": {"a.pages": [p], "a.protocol": proto},
         "headline": {"gmean_p50_us": 1.0 * p, "gmean_p99_us": 2.0 * p}}
        for i, (p, proto, status) in enumerate([(1024, "cold", "complete"), (4096, "cold", "complete"),
                                                (1024, "warm", "complete"), (4096, "warm", "failed")])
    ]  # fmt: skip
    summary = {"name": "x", "swept_keys": ["a.pages", "a.protocol", "a.fixed"], "points": points}
    paths = plot_sweep(summary, tmp_path)
    # a.fixed never varies: no file for it
    assert [p.name for p in paths] == ["sweep_a.pages.png", "sweep_a.protocol.png"]
    assert all(png_size(p)[0] > 600 for p in paths)
    assert (
        plot_sweep({**summary, "points": [{**p, "status": "failed"} for p in points]}, tmp_path)
        == []
    )


def test_without_matplotlib_plot_exits_2(cli, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    res = cli("plot", str(DATA / "host_base"), output=False)
    assert res.exit_code == 2
    assert res.output.strip() == "cpkv: error: plots need matplotlib: pip install 'cpkv[plot]'"


def test_plot_bad_target_exits_2(cli, tmp_path: Path) -> None:
    res = cli("plot", str(tmp_path), output=False)
    assert res.exit_code == 2 and "neither a run directory" in res.output


def test_runs_draw_plots_when_asked(cli, monkeypatch) -> None:
    """plots/ with --plots or CPKV_PLOTS=1, the flag winning over the environment; none
    otherwise; a plot that fails is a warning, the run stays complete."""
    small = ["alloc_host.host_sizes_gb=[]", "alloc_host.host_pages=[600]",
             "alloc_host.request_pages=[8,64]", "alloc_host.repeat=3", "alloc_host.warmup=0"]  # fmt: skip
    cli.plots = True  # CPKV_PLOTS=1
    assert cli("alloc", "host", *small).exit_code == 0
    assert cli("alloc", "host", *small, "--no-plots").exit_code == 0
    cli.plots = False  # CPKV_PLOTS=0
    assert cli("admit").exit_code == 0
    assert cli("admit", "--plots").exit_code == 0
    env_on, flag_off, env_off, flag_on = sorted(cli.run_dirs())
    assert sorted(p.name for p in (env_on / "plots").iterdir())  # the latency plot(s)
    assert (flag_on / "plots" / "per_tick.png").is_file()
    assert not (flag_off / "plots").exists() and not (env_off / "plots").exists()

    import cpkv.plots.records as records

    def broken(*args, **kwargs):
        raise RuntimeError("no ink")

    monkeypatch.setattr(records, "plot_run", broken)
    cli.plots = True
    with pytest.warns(UserWarning, match="plots: not drawn .RuntimeError: no ink"):
        res = cli("admit")
    assert res.exit_code == 0
    last = sorted(cli.run_dirs())[-1]
    assert json.loads((last / "meta.json").read_text())["status"] == "complete"
