"""The pure search (bracketing, then bisection) on functions whose threshold is known."""

from __future__ import annotations

import math

import pytest

from cpkv.capacity.bracket import (
    ABOVE_RANGE,
    BELOW_RANGE,
    FOUND,
    POINT_LIMIT,
    LoadSearch,
    round_load,
)


def search(threshold: float, **kw) -> tuple[LoadSearch, list[float]]:
    """Run a search against "met iff load <= threshold"; return it and the loads asked."""
    s = LoadSearch(**{"start": 1.0, "tolerance": 0.02, **kw})
    asked = []
    while (load := s.next_load()) is not None:
        asked.append(load)
        s.record(load, load <= threshold)
    return s, asked


@pytest.mark.parametrize("threshold", [3.7, 0.013, 1.0, 1.5, 250.0, 0.999])
def test_the_answer_is_within_the_tolerance_of_a_known_threshold(threshold: float) -> None:
    s, asked = search(threshold)
    assert s.outcome == FOUND
    # the answer met, a load at most 2% above it missed: the threshold lies in between
    assert s.low <= threshold < s.high <= s.low * 1.02
    assert abs(s.low - threshold) / threshold <= 0.02
    assert s.low == max(x for x in asked if x <= threshold)  # the highest load that met


def test_bracketing_grows_then_bisects_geometrically_by_hand() -> None:
    """Threshold 3.7 from 1: 1, 2, 4 bracket [2, 4]; the midpoints are geometric:
    sqrt(2*4) = 2.8284 (met), sqrt(2.8284*4) = 3.3636 (met), sqrt(3.3636*4) = 3.6680 (met),
    sqrt(3.668*4) = 3.8304 (missed), sqrt(3.668*3.8304) = 3.7483 (missed): 3.7483 / 3.668
    = 1.0219 > 1.02 goes on, sqrt(3.668*3.7483) = 3.7079 (missed): 3.7079 / 3.668 = 1.0109."""
    s, asked = search(3.7)
    assert asked == [1.0, 2.0, 4.0, 2.8284, 3.3636, 3.668, 3.8304, 3.7483, 3.7079]
    assert (s.low, s.high) == (3.668, 3.7079)


def test_bracketing_shrinks_when_the_first_load_misses() -> None:
    """Threshold 0.3 from 1 with growth 2: 1, 0.5 miss, 0.25 meets -> bracket [0.25, 0.5]."""
    s, asked = search(0.3)
    assert asked[:3] == [1.0, 0.5, 0.25]
    assert s.low <= 0.3 < s.high


def test_growth_and_tolerance_set_the_steps() -> None:
    """growth 10 from 1 to threshold 55: 1, 10, 100 (missed); tolerance 0.5: midpoints
    sqrt(1000) = 31.623 (met, 100/31.6 > 1.5), sqrt(3162.3) = 56.234 (missed, 56.2/31.6 =
    1.78 > 1.5), sqrt(31.623*56.234) = 42.170 (met, 56.234/42.17 = 1.33 <= 1.5): done."""
    s, asked = search(55.0, growth=10.0, tolerance=0.5)
    assert asked == [1.0, 10.0, 100.0, 31.623, 56.234, 42.17]
    assert s.outcome == FOUND and (s.low, s.high) == (42.17, 56.234)


def test_a_load_that_always_meets_ends_above_the_range() -> None:
    s, asked = search(math.inf, max_points=6)
    assert s.outcome == ABOVE_RANGE and s.high is None
    assert asked == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0] and s.low == 32.0


def test_a_load_that_never_meets_ends_below_the_range() -> None:
    s, asked = search(0.0, max_points=4)
    assert s.outcome == BELOW_RANGE and s.low is None
    assert asked == [1.0, 0.5, 0.25, 0.125]


def test_the_point_limit_reports_an_unfinished_bracket() -> None:
    s, asked = search(3.7, max_points=5)  # 1, 2, 4, 2.83, 3.36: bracket [3.36, 4] is 19% wide
    assert s.outcome == POINT_LIMIT and len(asked) == 5
    assert (s.low, s.high) == (3.3636, 4.0)


def test_recording_another_load_than_the_one_asked_is_a_bug() -> None:
    s = LoadSearch(start=1.0, tolerance=0.02)
    with pytest.raises(ValueError, match="not the one asked for"):
        s.record(2.0, True)


@pytest.mark.parametrize(
    "kw", [{"tolerance": 0.0001}, {"growth": 1.0}, {"max_points": 0}, {"start": -1.0}]
)
def test_bad_settings_are_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        LoadSearch(**{"start": 1.0, "tolerance": 0.02, **kw})


def test_loads_keep_five_significant_digits() -> None:
    assert round_load(math.sqrt(2)) == 1.4142
    assert round_load(123456.7) == 123460.0
    assert round_load(0.000123456) == 0.00012346
