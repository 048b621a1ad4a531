"""The capacity search on a serving config whose capacity is known in closed form
(tests/helpers/closed_form.py derives it: one instance serves exactly R = 50 requests/s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cpkv.capacity import run_capacity
from tests.helpers import closed_form as cf


@pytest.mark.parametrize("start", [1.0, 0.05])
def test_the_search_finds_r_within_its_tolerance(tmp_path: Path, start: float) -> None:
    """From above (speedup 1: 100 req/s, twice R) or from below (0.05: 5 req/s), the answer
    is within 2% of R, and the final bracket holds the hand-derived threshold."""
    config = cf.write_config(tmp_path / "case")
    res = run_capacity(str(config), flags={"tolerance": 0.02, "start": start},
                       root=tmp_path / "exp")  # fmt: skip
    (search,) = res.results
    assert search.outcome == "found"
    capacity_rps = search.capacity_load * 1000.0 / cf.SPACING_MS
    assert abs(capacity_rps - cf.R_RPS) / cf.R_RPS <= 0.02
    low, high = search.bracket
    assert low <= cf.THRESHOLD_SPEEDUP < high <= low * 1.02
    # every point's attainment is the one derived by hand, request by request
    for point in search.points:
        assert point.attainment_pct == pytest.approx(cf.attainment_pct(point.load), abs=1e-9)
        assert point.met == (point.attainment_pct >= 90.0)
        # offered load: 99 gaps of SPACING_MS / speedup over the run
        assert point.offered_requests_per_s == pytest.approx(point.load * 100.0, rel=1e-9)
    # the capacity point itself served R: 100 requests in 99 gaps of 20 ms + one iteration
    at = search.at_capacity
    assert at is not None and at.attainment_pct == 100.0


def test_a_tighter_tolerance_narrows_the_bracket(tmp_path: Path) -> None:
    config = cf.write_config(tmp_path / "case")
    res = run_capacity(str(config), flags={"tolerance": 0.001}, root=tmp_path / "exp")
    low, high = res.results[0].bracket
    assert low <= cf.THRESHOLD_SPEEDUP < high <= low * 1.001
    assert abs(low - cf.THRESHOLD_SPEEDUP) / cf.THRESHOLD_SPEEDUP <= 0.001


def test_the_search_directory_is_a_sweep_of_ordinary_runs(tmp_path: Path) -> None:
    config = cf.write_config(tmp_path / "case")
    res = run_capacity(str(config), root=tmp_path / "exp")
    path = res.path
    assert path.name.endswith("_capacity-closed-form") and not (path / "INCOMPLETE").exists()
    summary = json.loads((path / "summary.json").read_text())
    doc = json.loads((path / "capacity.json").read_text())
    (search,) = doc["searches"]
    tried = [p["point"] for p in search["points"]]
    assert [p["name"] for p in summary["points"]] == tried  # one sweep point per point tried
    assert summary["swept_keys"] == ["admit.arrivals.speedup"]
    for name, point in zip(tried, search["points"], strict=True):
        run = path / name
        assert (run / "results.json").is_file() and (run / "requests.jsonl").is_file()
        config_doc = yaml.safe_load((run / "config.yaml").read_text())
        assert config_doc["admit"]["arrivals"]["speedup"] == point["load"]
    assert doc["status"] == "complete" and search["capacity_load"] == res.results[0].capacity_load
    assert "capacity_speedup" in (path / "capacity.txt").read_text()


def test_a_second_axis_gives_one_capacity_per_value(tmp_path: Path) -> None:
    """admit.cost.fixed_us = 20 ms and 10 ms, the TTFT SLO staying 30 ms. F = 20 ms: T = 1.5 F,
    lambda* = 50 * 178/177 = 50.28 req/s (speedup 0.50282). F = 10 ms: R = 100 req/s, T = 3 F,
    request 89 meets iff 89 (F - 1/lambda) <= 2 F: lambda* = R / (1 - 2/89) = 100 * 89/87 =
    102.30 req/s (speedup 1.0230). Each answer is within 2% below its threshold."""
    config = cf.write_config(tmp_path / "case")
    res = run_capacity(str(config), ["admit.cost.fixed_us=20000,10000"], root=tmp_path / "exp")
    assert [r.label for r in res.results] == ["20000", "10000"]
    for r, threshold in zip(res.results, (0.5 * 178 / 177, 1.0 * 89 / 87), strict=True):
        low, high = r.bracket
        assert r.outcome == "found" and low <= threshold < high <= low * 1.02
    text = res.text
    assert "fixed_us=20000: points tried" in text and "fixed_us=10000: points tried" in text


def test_parallel_points_give_the_same_answer(tmp_path: Path) -> None:
    """Two worker processes run the two searches side by side: same points, same capacities."""
    config = cf.write_config(tmp_path / "case")
    serial = run_capacity(str(config), ["admit.cost.fixed_us=20000,10000"], root=tmp_path / "a")
    both = run_capacity(str(config), ["admit.cost.fixed_us=20000,10000"], root=tmp_path / "b",
                        jobs=2)  # fmt: skip
    assert [r.points for r in serial.results] == [r.points for r in both.results]
    assert [r.capacity_load for r in serial.results] == [r.capacity_load for r in both.results]
