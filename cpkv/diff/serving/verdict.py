"""The verdict of ``cpkv diff`` on two serving runs: ranked on what a serving engine is tuned for.

A serving run (``admit.mode: serving``) has one row of metrics that pull different ways: a
policy that lifts goodput may recompute more KV or preempt more. Judging each metric on its
own calls such a run a regression. Instead the metrics are ranked in tiers:

1. ``goodput``: ``goodput_requests_per_s`` (finished requests meeting ``admit.slo``, per s);
2. ``lost``: ``requests_lost``, the requests that did not finish (timed out, rejected, an
   aborted preemption victim being a rejection, cancelled), each one counting against its
   run; it ranks above latency because a run that loses its slowest requests drops them from
   its percentiles;
3. ``latency``: TTFT, TPOT, ITL (every gap between two tokens) and E2E at p50 and p99;
4. ``cost``: ``recompute_bytes`` (``recomputed_tokens`` in a run without it), ``swap_bytes``,
   ``preemptions``.

A metric moves when |change| exceeds its threshold: 1% for goodput and latency, 0 for the
counts of lost requests and the costs, unless ``-t METRIC:PCT`` (or ``other`` / ``*``) says
otherwise. The first tier in which a metric moved decides; within it, the metric that moved
most (from a zero base most of all; a tie goes to the tier's order). The verdict is
``improvement`` or ``regression`` by that metric's direction, ``same`` when no ranked metric
moved; ranked metrics that moved the other way are listed as ``despite``. Context metrics
(SLO attainment, throughput, KV utilisation) are shown, never ranked. ``--metric`` keeps the
named metrics only; one outside the tiers ranks after the costs by its row direction.

The requests behind the numbers are compared one by one (:mod:`cpkv.diff.serving.requests`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cpkv.core.errors import ConfigError
from cpkv.diff.cells import change_of
from cpkv.diff.rules import BETTER, NA, SAME, WORSE, Thresholds
from cpkv.diff.serving.requests import LOST_STATUSES, RequestDiff, compare_requests
from cpkv.runs.results import RunRecord

IMPROVEMENT, REGRESSION, UNCHANGED = "improvement", "regression", "same"
INFO = "info"
LOST = "requests_lost"
GOODPUT, LOST_TIER, LATENCY, COST, OTHER, CONTEXT = (
    "goodput", "lost", "latency", "cost", "other", "context",
)  # fmt: skip
RANKED_TIERS = (GOODPUT, LOST_TIER, LATENCY, COST, OTHER)
TIER_METRICS: dict[str, tuple[str, ...]] = {
    GOODPUT: ("goodput_requests_per_s",),
    LOST_TIER: (LOST,),
    LATENCY: (
        "ttft_p50_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "tpot_p99_ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "e2e_p50_ms",
        "e2e_p99_ms",
    ),  # fmt: skip
    COST: ("recompute_bytes", "swap_bytes", "preemptions"),
    CONTEXT: ("slo_attainment_pct", "throughput_tokens_per_s", "kv_util_mean_pct"),
}
COST_STANDIN = {"recompute_bytes": "recomputed_tokens"}
"""A cost a run may lack, and the row metric that stands for it then."""
MATERIAL_PCT = {GOODPUT: 1.0, LATENCY: 1.0, CONTEXT: 1.0}
"""Default thresholds (%) by tier; the other tiers: 0 (a lost request, a byte recomputed)."""


@dataclass(frozen=True)
class ServingMetric:
    """One metric of the serving table. ``ranked``: it can decide the verdict (the parts of
    ``requests_lost``, such as ``timed_out``, are shown under it and do not rank apart)."""

    key: str
    tier: str
    a: float | None
    b: float | None
    change_pct: float | None
    verdict: str
    ranked: bool = True
    decides: bool = False


@dataclass(frozen=True)
class ServingDiff:
    """Two serving runs (or one sweep point of each): the ranked table, the verdict, the
    metric that decided it, the ranked metrics that moved the other way, the requests."""

    point: str | None
    verdict: str
    decided_by: ServingMetric | None
    despite: list[ServingMetric]
    metrics: list[ServingMetric]
    requests: RequestDiff | None = None
    notes: list[str] = field(default_factory=list)

    def covered(self) -> set[str]:
        """Metric names the table shows: summary values of these names are left to it."""
        return {m.key for m in self.metrics} | {"finished", *LOST_STATUSES}


def is_serving(record: RunRecord) -> bool:
    """A run of the serving simulation: one row with a goodput."""
    return (
        record.summary.get("mode") == "serving"
        and len(record.rows) == 1
        and "goodput_requests_per_s" in record.columns.metrics
    )


def check_metrics(metrics: Sequence[str], record: RunRecord) -> None:
    """ConfigError for a ``--metric`` that is not a metric of this serving run."""
    allowed = [*record.columns.metrics, LOST]
    for m in metrics:
        if m not in allowed:
            raise ConfigError(
                f"--metric {m}: not a metric of a serving run (metrics: {', '.join(allowed)})"
            )


def compare_serving(
    point: str | None, ra: RunRecord, rb: RunRecord, dirs: tuple[Path, Path], th: Thresholds,
    metrics: Sequence[str] = (),
) -> ServingDiff:  # fmt: skip
    """The ranked comparison of two serving runs (see the module docstring); ``dirs``: their
    run directories (for ``requests.jsonl``)."""
    row_a, row_b = _with_lost(ra.rows[0]), _with_lost(rb.rows[0])
    lower = set(ra.columns.lower_is_better)
    table: list[ServingMetric] = []
    for tier, key in _layout(row_a, row_b, metrics):
        down = key in lower if tier == OTHER else tier != GOODPUT
        table.append(_judge(key, tier, row_a.get(key), row_b.get(key), th, down))
        if key == LOST:
            parts = [p for p in LOST_STATUSES if p in row_a and p in row_b]
            table += [
                replace(_judge(p, tier, row_a[p], row_b[p], th, True), ranked=False) for p in parts
            ]
    verdict, decider = _decide(table)
    if decider is not None:
        table = [replace(m, decides=True) if m is decider else m for m in table]
        decider = next(m for m in table if m.decides)
    wrong = WORSE if verdict == IMPROVEMENT else BETTER
    despite = [m for m in table if m.ranked and m.verdict == wrong] if decider else []
    requests, notes = compare_requests(dirs[0], dirs[1], th)
    return ServingDiff(point, verdict, decider, despite, table, requests, notes)


def _with_lost(row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    total, done = row.get("requests"), row.get("finished")
    if _is_count(total) and _is_count(done):
        out[LOST] = total - done
    return out


def _layout(
    row_a: Mapping[str, Any], row_b: Mapping[str, Any], metrics: Sequence[str]
) -> list[tuple[str, str]]:
    """(tier, metric) in table order: each tier's metrics that both rows have. With
    ``--metric``: only those named, a metric outside the ranked tiers in tier ``other``."""
    out: list[tuple[str, str]] = []
    for tier in RANKED_TIERS if metrics else (*RANKED_TIERS, CONTEXT):
        for key in TIER_METRICS.get(tier, ()):
            if key not in row_a or key not in row_b:
                key = COST_STANDIN.get(key, "")
            if key in row_a and key in row_b and (not metrics or key in metrics):
                out.append((tier, key))
    shown = {k for _, k in out}
    out += [(OTHER, k) for k in metrics if k in row_a and k in row_b and k not in shown]
    return out


def _judge(
    key: str, tier: str, a: Any, b: Any, th: Thresholds, lower_is_better: bool
) -> ServingMetric:
    fa, fb = _num(a), _num(b)
    change = change_of(fa, fb)
    ranked = tier != CONTEXT
    if fa is None or fb is None or change is None:
        return ServingMetric(key, tier, fa, fb, None, NA, ranked)
    verdict = SAME
    if fa != fb and abs(change) > _threshold(th, key, tier):
        if not ranked:
            verdict = INFO
        else:
            verdict = WORSE if (fb > fa) == lower_is_better else BETTER
    return ServingMetric(key, tier, fa, fb, change, verdict, ranked)


def _threshold(th: Thresholds, key: str, tier: str) -> float:
    if any(k in th.by_name for k in (key, "other", "*")):
        return th.pct(key, False)
    return MATERIAL_PCT.get(tier, 0.0)


def _decide(table: Sequence[ServingMetric]) -> tuple[str, ServingMetric | None]:
    for tier in RANKED_TIERS:
        moved = [m for m in table if m.tier == tier and m.ranked and m.verdict in (WORSE, BETTER)]
        if moved:
            top = max(enumerate(moved), key=lambda im: (_size(im[1]), -im[0]))[1]
            return (IMPROVEMENT if top.verdict == BETTER else REGRESSION), top
    return UNCHANGED, None


def _size(m: ServingMetric) -> float:
    return math.inf if m.change_pct is None else abs(m.change_pct)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _num(value: Any) -> float | None:
    """A finite number as it is (a count stays an int), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return value if math.isfinite(value) else None
    except OverflowError:  # an int beyond float range (a damaged results.json)
        return None
