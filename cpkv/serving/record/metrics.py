"""Metrics of a serving run: one summary row, per-request lines, the KV timeline.

Definitions (times are simulated; a token is stamped at the end of the iteration that
generates it):

* queue = first admission - arrival; TTFT = first token - arrival; E2E = finish - arrival;
  TPOT = (finish - first token) / (output tokens - 1), for requests with >= 2 tokens;
* ITL (inter-token latency) = every gap between two consecutive tokens of a finished
  request, pooled over the requests (:mod:`cpkv.serving.record.itl`): TPOT averages a
  request's gaps, ITL keeps them apart, so a stall (a prefill batch that does not decode
  the running requests, a preemption's recompute) shows in its p99 and max;
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

Every number is exact, whatever the run's length: requests are counted as they end (:class:`RequestStats`), their ``requests.jsonl`` lines are written
as they end (in input order: a line waits only for the earlier requests still running),
and each latency series is kept whole but compact (8 bytes per request: one ``array('d')``
per series), so percentiles and means come from all the values, sorted, the mean being
their sum in ascending order. The KV integrals come from the iteration log
(:mod:`cpkv.serving.record.iteration_log`), the timeline from its samples read back once
the makespan is known (:mod:`cpkv.serving.record.timeline`).

Percentiles: every one this module reports (queue, TTFT, TPOT, E2E at p50 / p90 / p95 / p99,
ITL at p50 / p90 / p99) and every mean is exact, none is estimated: the four latency series
are the only per-request state a run keeps after a request ends, 32 bytes a request (32 MB
for a million requests), sorted once at the end; a percentile interpolates between two of
their order statistics. The ITL's gaps are weighted records of the iterations (spilled with
the iteration log), their order statistics found by counting passes over them.
No sketch or sample is used anywhere (the latency CDF plot is drawn through up to 4,000
order statistics of the same sorted values, :mod:`cpkv.plots.serving`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cpkv.runs.results import metric, outcome
from cpkv.serving.model.request import FINISHED, Req
from cpkv.serving.record.itl import ItlStats, itl_stats
from cpkv.serving.record.requests import PERCENTILES, RequestStats, RequestSummary, percentile
from cpkv.serving.record.segments import Integrals
from cpkv.serving.schema import SloSpec

__all__ = ["PERCENTILES", "percentile"]  # (the latency statistics' own, read here too)


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
    itl_mean_ms: float | None = _ms()
    itl_p50_ms: float | None = _ms()
    itl_p90_ms: float | None = _ms()
    itl_p99_ms: float | None = _ms()
    itl_max_ms: float | None = _ms()
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
    """:class:`~cpkv.serving.record.requests.RequestStats` of requests kept whole (input order)."""
    stats = RequestStats(slo, write)
    for r in requests:
        stats.done(r)
    stats.close()
    return stats


def summary_row(res: Any, slo: SloSpec, capacity_blocks: int) -> ServingRow:
    """The :class:`ServingRow` of a run that kept its requests
    (:func:`~cpkv.serving.engine.simulate.simulate`)."""
    assert res.requests is not None, "summary_row needs the requests: use row_of for a stream"
    summary = stats_of(res.requests, slo).summary()
    itl = itl_stats([res.samples]) if res.samples is not None else None
    return row_of(summary, res.integrals, res.end_us, capacity_blocks, itl)


def row_of(
    stats: RequestSummary, totals: Integrals, end_us: float, capacity_blocks: int,
    itl: ItlStats | None = None,
) -> ServingRow:  # fmt: skip
    """The run's :class:`ServingRow` from its requests' stats, its iterations' integrals and
    its token gaps' statistics (None: not known)."""
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
        **(ItlStats() if itl is None else itl).columns(),
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


def request_lines(res: Any) -> str:
    """``requests.jsonl`` of a run that kept its requests: one JSON object per request, in
    input order."""
    assert res.requests is not None
    parts: list[str] = []
    stats_of(res.requests, SloSpec(), parts.append)
    return "".join(parts)


def timeline(res: Any, capacity_blocks: int, points: int) -> list[dict[str, Any]]:
    """The timeline of a run that kept its samples: ``points`` equal buckets of [0, makespan]."""
    if res.samples is None or res.end_us <= 0:
        return []
    sums = res.samples.summary(res.end_us, points).timeline
    return sums.rows(capacity_blocks, res.samples.cost.peak_flops_per_us)


def log_report(
    log: Any, end_us: float, capacity_blocks: int, points: int
) -> tuple[Integrals, list[dict[str, Any]], dict[str, Any]]:
    """What a run's iteration log reports over a makespan of ``end_us``: its integrals, its
    ``timeline.jsonl`` points and the summary's ``time`` (where the time went)."""
    from cpkv.serving.cost.report import summed_time

    summary = log.summary(end_us, points)
    peak = log.cost.peak_flops_per_us
    rows = [] if summary.timeline is None else summary.timeline.rows(capacity_blocks, peak)
    return summary.integrals, rows, summed_time(summary.time_totals.sums, end_us, peak)


def added_counts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of several engines added up: numbers summed, counts by name merged."""
    out: dict[str, Any] = {}
    for part in parts:
        for name, value in part.items():
            if isinstance(value, dict):
                into = out.setdefault(name, {})
                for key, count in value.items():
                    into[key] = into.get(key, 0) + count
            else:
                out[name] = out.get(name, 0) + value
    return out
