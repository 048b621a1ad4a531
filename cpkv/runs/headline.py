"""Headline metrics: a few numbers that stand for a whole run (sweep summaries, ``cpkv ls``).

The ``headline`` mapping of the run's summary when its kind provides one; otherwise its first
three metrics (in table order) over all rows: the geometric mean of a timing metric
(``gmean_p50_us``), the arithmetic mean of any other (``mean_x``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from cpkv.runs.results import RunRecord

HEADLINE_METRICS = 3


def headline(record: RunRecord, limit: int = HEADLINE_METRICS) -> dict[str, float]:
    """A few numbers that stand for a whole run (see the module docstring)."""
    given = record.summary.get("headline")
    if isinstance(given, Mapping):
        return {
            str(k): v if isinstance(v, int) else float(v) for k, v in given.items() if _number(v)
        }
    metrics = record.columns.metrics
    order = [c for c in record.table_columns or () if c in metrics] or list(metrics)
    out: dict[str, float] = {}
    for name in order[:limit]:
        values = [float(row[name]) for row in record.rows if _number(row.get(name))]
        if not values:
            continue
        if name in record.columns.timing:
            positive = [v for v in values if v > 0]
            out[f"gmean_{name}"] = statistics.geometric_mean(positive) if positive else 0.0
        else:
            out[f"mean_{name}"] = statistics.fmean(values)
    return out


def _number(value: Any) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range (a damaged results.json)
        return False
