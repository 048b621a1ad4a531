"""The noise rule of ``cpkv diff`` at the smallest sample count it uses (``repeat: 2``):
the median's interval ``p50 +- 1.58 x IQR / sqrt(2)``, by hand."""

from __future__ import annotations

import math

import pytest

from cpkv.diff.compare import NOISE, WORSE, Thresholds, compare_metric, spread
from cpkv.runs.results import Columns, RunRecord

COLS = Columns(("k",), ("p50_us",), ("p50_us",), (), ("p50_us",))
REC = RunRecord("alloc_host", "x", COLS, [], {})


def test_repeat_2_uses_the_interval_of_the_median() -> None:
    a = {"p50_us": 100.0, "p25_us": 90.0, "p75_us": 110.0, "repeat": 2}
    half = 1.58 * 20 / math.sqrt(2)  # 22.34
    assert spread(a, "p50_us") == pytest.approx((100 - half, 100 + half))
    # +25 %: beyond the 1.1 factor, but 125 - 22.34 = 102.66 <= 122.34: overlapping, noise
    b = {"p50_us": 125.0, "p25_us": 115.0, "p75_us": 135.0, "repeat": 2}
    assert compare_metric(None, {}, "p50_us", a, b, REC, Thresholds()).verdict == NOISE
    # +50 %: 150 - 22.34 = 127.66 > 122.34: apart, worse
    c = {"p50_us": 150.0, "p25_us": 140.0, "p75_us": 160.0, "repeat": 2}
    assert compare_metric(None, {}, "p50_us", a, c, REC, Thresholds()).verdict == WORSE


def test_repeat_1_falls_back_to_the_samples_spread() -> None:
    # one sample has no interval of its own: p05..p95 when present, else none (threshold only)
    a = {"p50_us": 100.0, "p25_us": 90.0, "p75_us": 110.0, "repeat": 1}
    assert spread(a, "p50_us") is None
    assert spread({**a, "p05_us": 80.0, "p95_us": 120.0}, "p50_us") == (80.0, 120.0)
    b = {"p50_us": 125.0, "p25_us": 115.0, "p75_us": 135.0, "repeat": 1}
    assert compare_metric(None, {}, "p50_us", a, b, REC, Thresholds()).verdict == WORSE
