"""A capacity search stays within the loads a run can take: the load key's bounds and the
simulation clock's range. An SLO no load meets ends ``below_range`` at the lowest load the
clock resolves (never ``found`` at a load whose TTFTs round to 0), and a search whose loads
would underflow to 0 ends instead of failing."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpkv.capacity.bracket import ABOVE_RANGE, BELOW_RANGE, FOUND, LoadSearch
from cpkv.capacity.load_range import load_range
from cpkv.capacity.run import run_capacity
from cpkv.core.config import load_config
from cpkv.core.schema.limits import CLOCK_LIMIT_S
from cpkv.serving.engine.clock import poisson_span_factor
from cpkv.serving.schema import MAX_RATE_RPS, MIN_RATE_RPS


def asked(search: LoadSearch, met) -> list[float]:
    loads = []
    while (load := search.next_load()) is not None:
        loads.append(load)
        search.record(load, met(load))
    return loads


def test_bracketing_down_stops_at_the_floor_after_trying_it() -> None:
    s = LoadSearch(1.0, 0.02, growth=1000, floor=3.3e-8)
    loads = asked(s, lambda load: False)
    assert loads[-1] >= 3.3e-8 and loads[-1] == pytest.approx(3.3e-8, rel=1e-4)
    assert all(x >= 3.3e-8 for x in loads) and s.outcome == BELOW_RANGE


def test_bracketing_up_stops_at_the_ceiling_after_trying_it() -> None:
    s = LoadSearch(1.0, 0.02, growth=1000, ceiling=5e7)
    loads = asked(s, lambda load: True)
    assert loads[-1] == 5e7 and s.outcome == ABOVE_RANGE


def test_a_threshold_near_the_floor_is_still_found() -> None:
    s = LoadSearch(1.0, 0.02, growth=10, floor=1e-4)
    asked(s, lambda load: load <= 2e-4)
    assert s.outcome == FOUND and s.low <= 2e-4 < s.high


@pytest.mark.parametrize(("start", "met"), [(1e-300, False), (1e300, True)])
def test_loads_that_leave_the_floats_end_the_search(start: float, met: bool) -> None:
    s = LoadSearch(start, 0.02, growth=1000, max_points=200)
    loads = asked(s, lambda load: met)
    assert all(0 < x < float("inf") for x in loads)
    assert s.outcome == (ABOVE_RANGE if met else BELOW_RANGE) and len(loads) < 200


def test_the_range_of_a_poisson_load_is_the_keys_and_the_clocks() -> None:
    cfg = load_config("admit", None, ["admit.mode=serving", "admit.arrivals.process=poisson"])
    floor, ceiling = load_range("admit.arrivals.rate_rps", cfg.resolved)
    # the grid's 8 requests at rate r arrive within 8 t / r s (but for a 1e-9 chance),
    # which must fit the clock
    fits = 8 * poisson_span_factor(8) / CLOCK_LIMIT_S
    assert floor == pytest.approx(max(MIN_RATE_RPS, fits)) and ceiling == MAX_RATE_RPS


def test_an_slo_no_load_meets_ends_below_range_within_the_clock(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "kind: admit\nname: never\nadmit:\n  mode: serving\n  kv: {capacity_blocks: 4096}\n"
        "  arrivals: {process: poisson, rate_rps: 1.0}\n  slo: {ttft_ms: 0.001}\n"
    )
    result = run_capacity(str(config), flags={"growth": 1000.0}, root=tmp_path / "out")
    (search,) = result.results
    assert search.outcome == BELOW_RANGE and search.capacity_load is None
    loads = [p.load for p in search.points]
    floor, _ = load_range("admit.arrivals.rate_rps", result.plan.values[0].config)
    assert min(loads) >= floor and not any(p.met for p in search.points)
