"""The verdict rule of ``cpkv diff``: thresholds, the rank test, and one metric of one row pair.

A timing change counts only when it is both larger than a factor and significant (as asv
and pyperf judge benchmarks). *Larger than a factor*: B/A > ``factor`` or A/B > ``factor``
(``--factor``, default 1.1); a ``--threshold`` that names the metric, or ``timing``, sets
that metric's factor to 1 + PCT/100 instead, so one knob covers a timing at a time.
*Significant*: the two rows' raw samples differ, in the direction of the change: a
two-sided Mann–Whitney U test on them gives p < ``alpha`` (default 0.05;
:mod:`cpkv.diff.ranktest`) and B's samples tend to be larger when the metric grew, smaller
when it shrank (a p99 that grew while the samples as a whole got faster is a tail burst, not
a regression). Over a whole diff the p-values are adjusted for the number of rows tested
(Benjamini–Hochberg), so that a diff of many rows of identical code does not find
regressions by chance. Rows without raw samples (results written before cpkv kept them) fall
back to the interval rule: the change counts when the two rows' uncertainty intervals do not
overlap (see :func:`spread`). A timing change beyond its factor that does not pass the test
is ``noise``; one within its factor is ``same``, however significant.

Other metrics are deterministic: they change when |change| exceeds their threshold in
percent (``--threshold METRIC:PCT``, ``other:PCT`` or ``*:PCT``; default 0 %).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cpkv.core.errors import ConfigError
from cpkv.diff.ranktest import MIN_SAMPLES, RankTest, mann_whitney_u
from cpkv.runs.results import RunRecord

DEFAULT_FACTOR = 1.1
"""A timing change must exceed this ratio either way (B/A or A/B), as asv's default."""
DEFAULT_OTHER_PCT = 0.0
DEFAULT_ALPHA = 0.05
WORSE, BETTER, NOISE, SAME, NA, INFO = "worse", "better", "noise", "same", "n/a", "info"
RANK, INTERVAL, THRESHOLD, PAIRED = "rank", "interval", "threshold", "paired"
"""How a timing verdict was reached: the rank test on raw samples, the interval fallback, the
factor alone (a timing metric whose rows have neither samples nor spread columns), or the
paired test of a rerun's rounds (:mod:`cpkv.diff.rerun.paired`)."""
_FAMILY = re.compile(r"^(?P<pre>.*?)(?P<stat>mean|median|min|max|stdev|p\d+)_(?P<unit>[A-Za-z]+)$")


@dataclass(frozen=True)
class Thresholds:
    """How large a change must be to count.

    A timing metric's limit is a factor (B/A or A/B beyond it): ``by_name[metric]``, else
    ``by_name["timing"]``, as 1 + PCT/100; else ``factor``. Any other metric's limit is a
    percentage: ``by_name[metric]``, else ``other``, else ``*``, else 0 %.
    """

    by_name: Mapping[str, float] = field(default_factory=dict)
    factor: float = DEFAULT_FACTOR

    @classmethod
    def parse(cls, specs: Sequence[str], factor: float = DEFAULT_FACTOR) -> Thresholds:
        if not math.isfinite(factor) or factor < 1:
            raise ConfigError(
                f"--factor {factor:g}: expected a ratio >= 1 (1.1: a timing must move by more "
                "than 10 % either way to count; 1: any significant move counts)"
            )
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
        return cls(out, factor)

    def pct(self, metric: str, timing: bool = False) -> float:
        """The limit in percent (a timing's: its factor's, on the rising side)."""
        for key in (metric, "timing") if timing else (metric, "other", "*"):
            if key in self.by_name:
                return self.by_name[key]
        return (self.factor - 1) * 100.0 if timing else DEFAULT_OTHER_PCT

    def factor_for(self, metric: str) -> float:
        """The factor a timing ``metric`` must exceed, either way."""
        for key in (metric, "timing"):
            if key in self.by_name:
                return 1 + self.by_name[key] / 100.0
        return self.factor

    def exceeds(self, metric: str, timing: bool, a: float, b: float) -> bool:
        """Whether A -> B is larger than the metric's limit (see the class docstring)."""
        if a == b:
            return False
        if timing and a > 0 and b > 0:
            return max(b / a, a / b) > self.factor_for(metric)
        change = (b - a) / abs(a) * 100.0 if a else math.inf
        return abs(change) > self.pct(metric, timing)


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
    rule: str | None = None  # timing metrics beyond their factor: RANK, INTERVAL, THRESHOLD, PAIRED
    p_value: float | None = None  # the row's rank test (adjusted over the rows of a diff)
    moved: str | None = None  # WORSE / BETTER by direction alone, before the significance test
    agrees: bool = True  # the rank test's shift has the direction of this metric's change
    rounds: tuple[float, ...] = ()  # a rerun's per-round ratios B/A (PAIRED)


def rank_test(
    row_a: Mapping[str, Any], row_b: Mapping[str, Any], field: str | None
) -> RankTest | None:
    """The Mann–Whitney U test of the rows' raw samples in ``field`` (None: too few samples)."""
    if field is None:
        return None
    xs, ys = _samples(row_a.get(field)), _samples(row_b.get(field))
    if min(len(xs), len(ys)) < MIN_SAMPLES:
        return None
    return mann_whitney_u(xs, ys)


def compare_metric(
    point: str | None, ident: dict[str, Any], metric: str, row_a: Mapping[str, Any], row_b: Mapping[str, Any],
    record: RunRecord, th: Thresholds, alpha: float = DEFAULT_ALPHA, test: RankTest | None = None,
) -> MetricChange:  # fmt: skip
    """One metric of one matched row pair, with its verdict (see the module docstring).

    ``test``: the rows' rank test when the caller has run it (with a p-value already adjusted
    for the number of rows it tested); else it is run here. A timing metric with no samples of
    its own unit in a row that has samples (a ratio of two rows' statistics: ``vs_reference``)
    is ``info``: the rows it is computed from are judged on their own samples.
    """
    timing = metric in record.columns.timing
    a, b = _num(row_a.get(metric)), _num(row_b.get(metric))
    if a is None or b is None:
        return MetricChange(point, ident, metric, a, b, None, None, NA, timing)
    ratio = b / a if a else None
    change = (b - a) / abs(a) * 100.0 if a else (0.0 if b == a else float("inf"))
    verdict, rule, p_value, moved, agrees = SAME, None, None, None, True
    if timing and samples_field(record, row_a, metric) is None and _has_samples(record, row_a):
        verdict = INFO if b != a else SAME
        return MetricChange(point, ident, metric, a, b, ratio, change, verdict, timing)
    if th.exceeds(metric, timing, a, b):
        worse = (b > a) == (metric in record.columns.lower_is_better)
        verdict = moved = WORSE if worse else BETTER
        if timing:
            test = test or rank_test(row_a, row_b, samples_field(record, row_a, metric))
            if test is not None:
                rule, p_value = RANK, test.p_value
                agrees = test.shift == (1 if b > a else -1)
                if p_value >= alpha or not agrees:
                    verdict = NOISE
            elif spread(row_a, metric) is not None and spread(row_b, metric) is not None:
                rule = INTERVAL
                if _overlap(spread(row_a, metric), spread(row_b, metric)):
                    verdict = NOISE
            else:
                rule = THRESHOLD
    return MetricChange(point, ident, metric, a, b, ratio, change, verdict, timing, rule, p_value,
                        moved, agrees)  # fmt: skip


def samples_field(record: RunRecord, row: Mapping[str, Any], metric: str) -> str | None:
    """The raw-samples column behind a timing ``metric`` ``<pre><stat>_<unit>``:
    ``<pre>samples_<unit>`` when the row has it, else None (results written before cpkv kept
    samples, or a ratio such as ``vs_reference`` whose unit has no samples)."""
    m = _FAMILY.match(metric)
    if not m:
        return None
    own = f"{m.group('pre')}samples_{m.group('unit')}"
    return own if own in record.columns.samples and own in row else None


def _has_samples(record: RunRecord, row: Mapping[str, Any]) -> bool:
    return any(c in row for c in record.columns.samples)


def _samples(value: Any) -> list[float]:
    if not isinstance(value, list | tuple):
        return []
    return [float(v) for v in value if _num(v) is not None]


def spread(row: Mapping[str, Any], metric: str) -> tuple[float, float] | None:
    """The uncertainty interval of the row's ``metric``; None when the row cannot tell.

    With the sample count (``repeat``) in the row, the interval is that of the statistic,
    not of single samples, so that one outlier cannot hide a real shift:

    * a median (``p50``) with ``p25``/``p75``: the notched-box-plot interval of the median,
      ``p50 +- 1.58 IQR / sqrt(n)`` (McGill, Tukey and Larsen), robust to outliers;
    * a mean with ``stdev``: ``mean +- 2 stdev / sqrt(n)`` (about 95 % for the mean).

    Otherwise (other statistics, or rows without those columns) the spread of the samples:
    ``[p05, p95]``, else ``value +- stdev``, else ``[min, max]``.

    This is the fallback for rows without raw samples; rows with them are rank-tested.
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
