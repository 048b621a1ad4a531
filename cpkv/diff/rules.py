"""The verdict rule of ``cpkv diff``: thresholds, spreads, and one metric of one row pair.

A change counts when |change| exceeds the metric's threshold (default 10% for timing
metrics, 0% for the others, which are deterministic); a timing change counts only when, in
addition, the two rows' spreads do not overlap (see :func:`spread`). See :mod:`cpkv.diff.compare`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cpkv.core.errors import ConfigError
from cpkv.runs.results import RunRecord

DEFAULT_TIMING_PCT, DEFAULT_OTHER_PCT = 10.0, 0.0
WORSE, BETTER, NOISE, SAME, NA = "worse", "better", "noise", "same", "n/a"
_FAMILY = re.compile(r"^(?P<pre>.*?)(?P<stat>mean|median|min|max|stdev|p\d+)_(?P<unit>[A-Za-z]+)$")


@dataclass(frozen=True)
class Thresholds:
    """Per-metric thresholds in percent: by name, then ``timing`` / ``*`` groups, then defaults."""

    by_name: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs: Sequence[str]) -> Thresholds:
        out = {}
        for spec in specs:
            metric, _, pct = spec.rpartition(":")
            try:
                value = float(pct.strip().rstrip("%"))
            except ValueError:
                value = -1.0
            if not metric.strip() or not math.isfinite(value) or value < 0:
                raise ConfigError(
                    f"--threshold {spec!r}: expected METRIC:PCT (p50_us:5, timing:10%, *:0)"
                )
            out[metric.strip()] = value
        return cls(out)

    def pct(self, metric: str, timing: bool) -> float:
        for key in (metric, "timing" if timing else "other", "*"):
            if key in self.by_name:
                return self.by_name[key]
        return DEFAULT_TIMING_PCT if timing else DEFAULT_OTHER_PCT


@dataclass(frozen=True)
class MetricChange:
    point: str | None
    row: dict[str, Any]
    metric: str
    a: float | None
    b: float | None
    ratio: float | None
    change_pct: float | None
    verdict: str
    timing: bool


def compare_metric(
    point: str | None, ident: dict[str, Any], metric: str, row_a: Mapping[str, Any], row_b: Mapping[str, Any],
    record: RunRecord, th: Thresholds,
) -> MetricChange:  # fmt: skip
    """One metric of one matched row pair, with its verdict (see the module docstring)."""
    timing = metric in record.columns.timing
    a, b = _num(row_a.get(metric)), _num(row_b.get(metric))
    if a is None or b is None:
        return MetricChange(point, ident, metric, a, b, None, None, NA, timing)
    ratio = b / a if a else None
    change = (b - a) / abs(a) * 100.0 if a else (0.0 if b == a else float("inf"))
    verdict = SAME
    if b != a and abs(change) > th.pct(metric, timing):
        worse = (b > a) == (metric in record.columns.lower_is_better)
        verdict = WORSE if worse else BETTER
        if timing and _overlap(spread(row_a, metric), spread(row_b, metric)):
            verdict = NOISE
    return MetricChange(point, ident, metric, a, b, ratio, change, verdict, timing)


def spread(row: Mapping[str, Any], metric: str) -> tuple[float, float] | None:
    """The uncertainty interval of the row's ``metric``; None when the row cannot tell.

    With the sample count (``repeat``) in the row, the interval is that of the statistic,
    not of single samples, so that one outlier cannot hide a real shift:

    * a median (``p50``) with ``p25``/``p75``: the notched-box-plot interval of the median,
      ``p50 +- 1.58 IQR / sqrt(n)`` (McGill, Tukey and Larsen), robust to outliers;
    * a mean with ``stdev``: ``mean +- 2 stdev / sqrt(n)`` (about 95 % for the mean).

    Otherwise (other statistics, or rows without those columns) the spread of the samples:
    ``[p05, p95]``, else ``value +- stdev``, else ``[min, max]``.
    """
    m = _FAMILY.match(metric)
    if not m:
        return None
    pre, stat, unit = m.group("pre"), m.group("stat"), m.group("unit")
    get = lambda name: _num(row.get(f"{pre}{name}_{unit}"))  # noqa: E731
    value, sd, n = _num(row.get(metric)), get("stdev"), _num(row.get("repeat"))
    if value is not None and n is not None and n >= 2:
        root = math.sqrt(n)
        q1, q3 = get("p25"), get("p75")
        if stat in ("p50", "median") and q1 is not None and q3 is not None:
            half = 1.58 * (q3 - q1) / root
            return (value - half, value + half)
        if stat == "mean" and sd is not None:
            return (value - 2 * sd / root, value + 2 * sd / root)
    lo, hi = get("p05"), get("p95")
    if lo is not None and hi is not None:
        return (lo, hi)
    if sd is not None and value is not None:
        return (value - sd, value + sd)
    lo, hi = get("min"), get("max")
    return (lo, hi) if lo is not None and hi is not None else None


def _overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    if a is None or b is None:
        return False
    return a[0] <= b[1] and b[0] <= a[1]


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond float range (a damaged results.json)
        return None
