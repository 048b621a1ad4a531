"""The summary side of ``cpkv diff``: a run's headline and summary numbers, A against B.

Every run has a few numbers that answer "did it get worse?" at a glance: its headline
(:func:`cpkv.runs.headline.headline`) and the totals of its summary (``ticks``,
``stops_by_budget``, ``goodput_requests_per_s``, ...). They are compared first and always.

A summary number is judged (``worse`` / ``better``) when its direction is known: declared
by the run (``summary_directions`` in results.json; ``neutral`` there: never judged), or
because it is one of the row metrics
(``ttft_p50_ms``), a mean of one (``mean_cache_pct``), or a mapping's value that mirrors one
(``itl_ms.p99`` is the row's ``itl_p99_ms``: :func:`row_metric_of`). A headline that summarises timing
rows (``gmean_p50_us``, ``median_vs_reference``) is ``info``: its rows are rank-tested one by one, and they decide.
Ratios of timings in a summary (keys under ``vs_*``, such as an allocator run's
``vs_reference_p50``) are ``info`` beyond the timing factor, like a timing headline.
Any other change is ``changed`` (reported, never a regression). Wall-clock parts of a summary
(the ``timing`` mapping and the row timing columns, such as ``duration_us``) are left out:
single wall-clock numbers have no samples to test. Nested mappings are flattened
(``stops_by_budget.rem_total_tokens``); a count missing from one side's mapping counts as 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cpkv.diff.rules import BETTER, SAME, WORSE, Thresholds
from cpkv.runs.headline import headline
from cpkv.runs.results import RunRecord

CHANGED, INFO = "changed", "info"
WALL_CLOCK_KEYS = ("timing", "headline")  # summary keys never compared as numbers
_MISSING = object()


@dataclass(frozen=True)
class SummaryChange:
    """One summary number (or value) of A against B. ``headline``: one of the run's headline
    numbers (shown even when it did not change)."""

    point: str | None
    key: str
    a: Any
    b: Any
    change_pct: float | None
    verdict: str
    headline: bool


def compare_summaries(
    point: str | None, ra: RunRecord, rb: RunRecord, th: Thresholds
) -> list[SummaryChange]:
    """The headline numbers of A and B, then every other summary value (see the module docstring)."""
    out: list[SummaryChange] = []
    ha, hb = headline(ra), headline(rb)
    for key in dict.fromkeys([*ha, *hb]):
        out.append(_judge(point, key, ha.get(key), hb.get(key), ra, th, headline=True))
    shown = {c.key for c in out}
    skip = set(WALL_CLOCK_KEYS) | set(ra.columns.timing) | set(rb.columns.timing)
    flat_a, flat_b = dict(_flatten(ra.summary, skip)), dict(_flatten(rb.summary, skip))
    for key in dict.fromkeys([*flat_a, *flat_b]):
        if key in shown:
            continue
        a, b = flat_a.get(key, _MISSING), flat_b.get(key, _MISSING)
        a, b = _counts_default(key, a, b, ra.summary, rb.summary)
        out.append(_judge(point, key, a, b, ra, th, headline=False))
    return out


def direction(key: str, record: RunRecord) -> str | None:
    """``lower`` / ``higher`` / ``info`` for a summary key, or None when nothing says."""
    declared = record.summary_directions.get(key)
    if declared:
        return declared
    if key.split(".")[0].startswith("vs_"):
        return INFO  # a ratio of timings: the rows behind it are rank-tested
    cols = record.columns
    prefixes = ("gmean_", "mean_", "median_")
    mirrored = row_metric_of(key)
    for name in (key, mirrored, *(key[len(p) :] for p in prefixes if key.startswith(p))):
        if name in cols.metrics:
            if name in cols.timing and name != key:
                return INFO
            return "lower" if name in cols.lower_is_better else "higher"
    return None


def _judge(
    point: str | None, key: str, a: Any, b: Any, record: RunRecord, th: Thresholds, *, headline: bool
) -> SummaryChange:  # fmt: skip
    a = None if a is _MISSING else a
    b = None if b is _MISSING else b
    if not (_is_num(a) and _is_num(b)):
        same = json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        return SummaryChange(point, key, a, b, None, SAME if same else CHANGED, headline)
    fa, fb = float(a), float(b)
    change = (fb - fa) / abs(fa) * 100.0 if fa else (0.0 if fa == fb else math.inf)
    way = direction(key, record)
    verdict = SAME
    if th.exceeds(key, way == INFO, fa, fb):
        if way in ("lower", "higher"):
            verdict = WORSE if (fb > fa) == (way == "lower") else BETTER
        else:
            verdict = INFO if way == INFO else CHANGED
    return SummaryChange(point, key, a, b, change, verdict, headline)


def row_metric_of(key: str) -> str:
    """The row metric a summary value mirrors: ``<series>_<unit>.<stat>`` (``itl_ms.p99``)
    is ``<series>_<stat>_<unit>`` (``itl_p99_ms``); any other key is itself."""
    head, dot, stat = key.rpartition(".")
    series, underscore, unit = head.rpartition("_")
    if not dot or "." in head or not underscore or not series:
        return key
    return f"{series}_{stat}_{unit}"


def _flatten(value: Any, skip: set[str], prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not prefix and k in skip:
                continue
            yield from _flatten(v, skip, f"{prefix}{k}.")
    elif prefix:
        yield prefix.rstrip("."), value


def _counts_default(key: str, a: Any, b: Any, sa: Mapping, sb: Mapping) -> tuple[Any, Any]:
    """A count missing from one side's mapping (``stops_by_budget``) is 0 there."""
    parent = key.rpartition(".")[0]
    if not parent or (a is not _MISSING and b is not _MISSING):
        return a, b
    if not (isinstance(_at(sa, parent), Mapping) and isinstance(_at(sb, parent), Mapping)):
        return a, b
    present = b if a is _MISSING else a
    if isinstance(present, int) and not isinstance(present, bool):
        return (0, b) if a is _MISSING else (a, 0)
    return a, b


def _at(tree: Mapping, dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
