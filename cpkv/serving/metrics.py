"""Metrics of a serving run: one summary row, per-request lines, the KV timeline.

Definitions (times are simulated; a token is stamped at the end of the iteration that
generates it):

* queue = first admission - arrival; TTFT = first token - arrival; E2E = finish - arrival;
  TPOT = (finish - first token) / (output tokens - 1), for requests with >= 2 tokens;
* percentiles interpolate linearly between order statistics (numpy's default);
* throughput = output tokens (requests) finished / makespan, the makespan being the time
  the last request finished or was rejected; goodput = finished requests meeting
  ``admit.slo`` / makespan; SLO attainment = those requests / all requests;
* admission rate = requests admitted at least once / requests;
* KV utilisation = blocks holding tokens / capacity, time-weighted over [0, makespan]
  (idle time counts as 0); ``kv_held`` also counts conservative reservations; peaks are
  over iterations;
* recomputed tokens = KV tokens that preemptions discarded (to be computed again);
  ``recompute_bytes`` in the summary = those x ``admit.cost.kv_bytes_per_token``.

Every number is exact, whatever the run's length, and computed as it always was: requests
are counted as they end (:class:`RequestStats`), their ``requests.jsonl`` lines are written
as they end (in input order: a line waits only for the earlier requests still running),
and each latency series is kept whole but compact (8 bytes per request: one ``array('d')``
per series), so percentiles and means come from all the values, sorted, the mean being
their sum in ascending order as before. The KV integrals come from the iteration log
(:mod:`cpkv.serving.iteration_log`), the timeline from its samples read back once the
makespan is known (:func:`timeline_points`); sums are sequential, in the order the
iterations ran, as ``sum()`` and ``+=`` add them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cpkv.runs.results import metric, outcome
from cpkv.serving.iteration_log import Integrals
from cpkv.serving.kv_pool import FINISHED, Req
from cpkv.serving.loop import SimResult
from cpkv.serving.records import SERIES, RequestStats, RequestSummary
from cpkv.serving.schema import SloSpec

PERCENTILES = (50, 90, 95, 99)
__all__ = ["SERIES", "RequestStats", "RequestSummary"]  # re-exported: the run and the tests read them here


def _ms(**kw: Any) -> Any:
    return metric(unit="ms", **kw)


@dataclass(frozen=True)
class ServingRow:
    """One run's headline metrics (no identity field: any two serving runs line up in diff)."""

    requests: int = outcome()
    finished: int = metric(unit="requests", lower_is_better=False)
    rejected: int = metric(unit="requests")
    admission_rate_pct: float = metric(unit="%", lower_is_better=False)
    preemptions: int = metric(unit="events")
    recomputed_tokens: int = metric(unit="tokens")
    queue_mean_ms: float | None = _ms()
    queue_p50_ms: float | None = _ms()
    queue_p90_ms: float | None = _ms()
    queue_p95_ms: float | None = _ms()
    queue_p99_ms: float | None = _ms()
    ttft_mean_ms: float | None = _ms()
    ttft_p50_ms: float | None = _ms()
    ttft_p90_ms: float | None = _ms()
    ttft_p95_ms: float | None = _ms()
    ttft_p99_ms: float | None = _ms()
    tpot_mean_ms: float | None = _ms()
    tpot_p50_ms: float | None = _ms()
    tpot_p90_ms: float | None = _ms()
    tpot_p95_ms: float | None = _ms()
    tpot_p99_ms: float | None = _ms()
    e2e_mean_ms: float | None = _ms()
    e2e_p50_ms: float | None = _ms()
    e2e_p90_ms: float | None = _ms()
    e2e_p95_ms: float | None = _ms()
    e2e_p99_ms: float | None = _ms()
    throughput_tokens_per_s: float | None = metric(unit="tokens/s", lower_is_better=False)
    throughput_requests_per_s: float | None = metric(unit="requests/s", lower_is_better=False)
    goodput_requests_per_s: float | None = metric(unit="requests/s", lower_is_better=False)
    slo_attainment_pct: float = metric(unit="%", lower_is_better=False)
    kv_util_mean_pct: float = metric(unit="%", lower_is_better=False)
    kv_util_peak_pct: float = metric(unit="%", lower_is_better=False)
    kv_held_mean_pct: float = metric(unit="%", lower_is_better=False)
    makespan_s: float = metric(unit="s")
    iterations: int = metric(unit="iterations")


TABLE_COLUMNS = (
    "goodput_requests_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
    "e2e_p99_ms", "throughput_tokens_per_s", "kv_util_mean_pct", "preemptions", "rejected",
    "finished",
)  # fmt: skip
"""Shown in results.txt and compared by default by ``cpkv diff`` (headline first: sweep
summaries and ``cpkv ls`` show the first ones)."""


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation; None when empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = q / 100.0 * (n - 1)
    lo = int(rank)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def latencies(r: Req) -> dict[str, float | None]:
    """``queue``, ``ttft``, ``tpot``, ``e2e`` of one request, in ms (None when undefined)."""

    def ms(t: float | None) -> float | None:
        return None if t is None else (t - r.arrival_us) / 1000.0

    tpot = None
    if r.state == FINISHED and r.first_token_us is not None and r.generated >= 2:
        tpot = (r.finished_us - r.first_token_us) / 1000.0 / (r.generated - 1)
    e2e = ms(r.finished_us) if r.state == FINISHED else None
    return {"queue": ms(r.admitted_us), "ttft": ms(r.first_token_us), "tpot": tpot, "e2e": e2e}


def stats_of(requests: Iterable[Req], slo: SloSpec, write: Any = None) -> RequestStats:
    """:class:`~cpkv.serving.records.RequestStats` of requests kept whole (input order)."""
    stats = RequestStats(slo, write)
    for r in requests:
        stats.done(r)
    stats.close()
    return stats


def summary_row(res: SimResult, slo: SloSpec, capacity_blocks: int) -> ServingRow:
    """The :class:`ServingRow` of a run that kept its requests (:func:`~cpkv.serving.loop.simulate`)."""
    assert res.requests is not None, "summary_row needs the requests: use row_of for a stream"
    summary = stats_of(res.requests, slo).summary()
    return row_of(summary, res.integrals, res.end_us, capacity_blocks)


def row_of(
    stats: RequestSummary, totals: Integrals, end_us: float, capacity_blocks: int
) -> ServingRow:
    """The run's :class:`ServingRow` from its requests' stats and its iterations' integrals."""
    span = end_us / 1e6
    per_s = (lambda v: v / span) if span > 0 else (lambda v: None)
    n = totals.iterations
    if end_us > 0:  # time integrals (block-us); with zero-time iterations, means per iteration
        used, held, busy = totals.used_block_us, totals.held_block_us, bool(n)
    else:
        used = totals.used_sum / n if n else 0.0
        held = totals.held_sum / n if n else 0.0
        busy = bool(n)
    cap = capacity_blocks * (span * 1e6 if span > 0 else 1.0)
    requests = stats.requests
    return ServingRow(
        requests=requests,
        finished=stats.finished,
        rejected=stats.rejected,
        admission_rate_pct=100.0 * stats.admitted / max(1, requests),
        preemptions=stats.preemptions,
        recomputed_tokens=stats.recomputed,
        **stats.latencies,
        throughput_tokens_per_s=per_s(stats.generated),
        throughput_requests_per_s=per_s(stats.finished),
        goodput_requests_per_s=per_s(stats.good),
        slo_attainment_pct=100.0 * stats.good / max(1, requests),
        kv_util_mean_pct=100.0 * used / cap if busy else 0.0,
        kv_util_peak_pct=100.0 * (totals.used_peak if n else 0) / capacity_blocks,
        kv_held_mean_pct=100.0 * held / cap if busy else 0.0,
        makespan_s=span,
        iterations=n,
    )


def request_lines(res: SimResult) -> str:
    """``requests.jsonl`` of a run that kept its requests: one JSON object per request, in
    input order."""
    assert res.requests is not None
    parts: list[str] = []
    stats_of(res.requests, SloSpec(), parts.append)
    return "".join(parts)


def timeline(res: SimResult, capacity_blocks: int, points: int) -> list[dict[str, float]]:
    """KV utilisation over time in ``points`` equal buckets of [0, makespan]."""
    if res.samples is None:
        return []
    return timeline_points(res.samples.chunks(), res.end_us, capacity_blocks, points)


def timeline_points(
    chunks: Iterable[tuple[np.ndarray, ...]], end: float, capacity_blocks: int, points: int
) -> list[dict[str, float]]:
    """KV utilisation over time in ``points`` equal buckets of [0, ``end``], from the
    iterations' samples ``(t0, dt, used, held, running, waiting)`` in order.

    An iteration adds ``value x part`` to each bucket it overlaps, ``part`` being
    ``min(stop, edge) - start`` of its piece in that bucket (the bucket of a start is
    ``min(int(start / width), points - 1)``; the last bucket takes whatever is left), and
    each bucket adds its pieces one by one in iteration order: the float operations of a
    loop over the iterations, done on arrays."""
    if end <= 0:
        return []
    width = end / points
    acc = np.zeros((points, 4))  # used, held, running, waiting (x time)
    peak: list[float | int] = [0.0] * points
    seen = False
    for t0, dt, used, held, running, waiting in chunks:
        if len(t0):
            seen = True
            _add_chunk(acc, peak, width, points, t0, dt, used, held, running, waiting)
    if not seen:
        return []
    scale = 100.0 / capacity_blocks
    return [
        {
            "t_s": round(k * width / 1e6, 6),
            "kv_used_mean_pct": round(float(a[0]) / width * scale, 4),
            "kv_used_peak_pct": round(peak[k] * scale, 4),
            "kv_held_mean_pct": round(float(a[1]) / width * scale, 4),
            "running_mean": round(float(a[2]) / width, 4),
            "waiting_mean": round(float(a[3]) / width, 4),
        }
        for k, a in enumerate(acc)
    ]


def _add_chunk(acc, peak, width, points, t0, dt, used, held, running, waiting) -> None:
    last = points - 1
    bucket = np.minimum((t0 / width).astype(np.int64), last)
    stop = t0 + dt
    edge = np.where(bucket < last, (bucket + 1) * width, stop)
    part = np.minimum(stop, edge) - t0
    order = np.arange(len(t0))
    values = [used * part, held * part, running * part, waiting * part]
    peaks = used
    crossing = np.flatnonzero((stop > edge) & (bucket < last))
    if len(crossing):  # the pieces of iterations that run on into later buckets
        extra_b, extra_i, extra_parts = [], [], []
        for i in crossing.tolist():
            k, t, end = int(bucket[i]) + 1, float(edge[i]), float(stop[i])
            while True:
                e = (k + 1) * width if k < last else end
                extra_b.append(k)
                extra_i.append(i)
                extra_parts.append(min(end, e) - t)
                if end <= e or k == last:
                    break
                t, k = e, k + 1
        ib = np.array(extra_i)
        pieces = np.array(extra_parts)
        bucket = np.concatenate([bucket, np.array(extra_b, dtype=np.int64)])
        order = np.concatenate([order, ib])
        values = [
            np.concatenate([v, s[ib] * pieces])
            for v, s in zip(values, (used, held, running, waiting), strict=True)
        ]
        peaks = np.concatenate([used, used[ib]])
        sort = np.lexsort((order, bucket))  # by bucket, then iteration order
        bucket = bucket[sort]
        values = [v[sort] for v in values]
        peaks = peaks[sort]
    elif len(bucket) > 1 and bool(np.any(bucket[1:] < bucket[:-1])):
        sort = np.argsort(bucket, kind="stable")
        bucket = bucket[sort]
        values = [v[sort] for v in values]
        peaks = peaks[sort]
    cuts = np.flatnonzero(bucket[1:] != bucket[:-1]) + 1
    starts = [0, *cuts.tolist()]
    ends = [*cuts.tolist(), len(bucket)]
    for a, b in zip(starts, ends, strict=True):
        k = int(bucket[a])
        for s in range(4):
            sums = np.empty(b - a + 1)
            sums[0] = acc[k, s]
            sums[1:] = values[s][a:b]
            acc[k, s] = np.cumsum(sums, out=sums)[-1]
        top = int(peaks[a:b].max())
        if top > peak[k]:
            peak[k] = top
