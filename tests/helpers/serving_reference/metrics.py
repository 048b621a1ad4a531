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
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpkv.runs.results import metric, outcome
from cpkv.serving.schema import SloSpec
from tests.helpers.serving_reference.kv_pool import FINISHED, REJECTED, Req
from tests.helpers.serving_reference.loop import SimResult

PERCENTILES = (50, 90, 95, 99)
SERIES = ("queue", "ttft", "tpot", "e2e")


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


def summary_row(res: SimResult, slo: SloSpec, capacity_blocks: int) -> ServingRow:
    """The run's :class:`ServingRow`."""
    reqs = res.requests
    lat = [latencies(r) for r in reqs]
    stats: dict[str, float | None] = {}
    for name in SERIES:
        values = sorted(
            x[name]
            for x, r in zip(lat, reqs, strict=True)
            if x[name] is not None and (name == "queue" or r.state == FINISHED)
        )
        stats[f"{name}_mean_ms"] = sum(values) / len(values) if values else None
        for q in PERCENTILES:
            stats[f"{name}_p{q}_ms"] = percentile(values, q)
    finished = [r for r in reqs if r.state == FINISHED]
    good = sum(
        slo.met(x["ttft"], x["tpot"]) for x, r in zip(lat, reqs, strict=True) if r.state == FINISHED
    )
    span = res.end_us / 1e6
    per_s = (lambda v: v / span) if span > 0 else (lambda v: None)
    used, held, busy = _weighted(res)
    cap = capacity_blocks * (span * 1e6 if span > 0 else 1.0)
    return ServingRow(
        requests=len(reqs),
        finished=len(finished),
        rejected=sum(r.state == REJECTED for r in reqs),
        admission_rate_pct=100.0 * sum(r.admitted_us is not None for r in reqs) / max(1, len(reqs)),
        preemptions=sum(r.preemptions for r in reqs),
        recomputed_tokens=sum(r.recomputed for r in reqs),
        **stats,
        throughput_tokens_per_s=per_s(sum(r.generated for r in finished)),
        throughput_requests_per_s=per_s(len(finished)),
        goodput_requests_per_s=per_s(good),
        slo_attainment_pct=100.0 * good / max(1, len(reqs)),
        kv_util_mean_pct=100.0 * used / cap if busy else 0.0,
        kv_util_peak_pct=100.0 * max(res.timeline[2], default=0) / capacity_blocks,
        kv_held_mean_pct=100.0 * held / cap if busy else 0.0,
        makespan_s=span,
        iterations=res.iterations,
    )


def _weighted(res: SimResult) -> tuple[float, float, bool]:
    """Time integrals of used and held blocks (block-us); with zero-time iterations,
    plain sums over iterations (so that the mean is per iteration)."""
    t0, dt, used, held = res.timeline[:4]
    if res.end_us > 0:
        return (
            sum(u * d for u, d in zip(used, dt, strict=True)),
            sum(h * d for h, d in zip(held, dt, strict=True)),
            bool(dt),
        )
    n = len(used)
    return (sum(used) / n if n else 0.0, sum(held) / n if n else 0.0, bool(n))


def request_lines(res: SimResult) -> str:
    """``requests.jsonl``: one JSON object per request, in input order."""
    out = []
    for r in res.requests:
        lat = latencies(r)
        out.append(
            {
                "rid": r.rid,
                "status": "finished" if r.state == FINISHED else "rejected",
                "reason": r.reject_reason,
                "arrival_ms": _round(r.arrival_us / 1000.0),
                "admitted_ms": _t(r.admitted_us),
                "first_token_ms": _t(r.first_token_us),
                "finish_ms": _t(r.finished_us),
                "queue_ms": _round(lat["queue"]),
                "ttft_ms": _round(lat["ttft"]),
                "tpot_ms": _round(lat["tpot"]),
                "e2e_ms": _round(lat["e2e"]),
                "prompt_tokens": r.prompt_tokens,
                "max_new_tokens": r.max_new_tokens,
                "output_tokens": r.generated,
                "computed_prompt_tokens": r.prefilled,
                "preemptions": r.preemptions,
                "recomputed_tokens": r.recomputed,
                "l1_hit_tokens": r.l1_hit,
                "l2_hit_tokens": r.l2_hit,
            }
        )
    return "".join(json.dumps(o, separators=(",", ":")) + "\n" for o in out)


def _t(us: float | None) -> float | None:
    return None if us is None else _round(us / 1000.0)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def timeline(res: SimResult, capacity_blocks: int, points: int) -> list[dict[str, float]]:
    """KV utilisation over time in ``points`` equal buckets of [0, makespan]."""
    t0s, dts, used, held, running, waiting = res.timeline
    end = res.end_us
    if end <= 0 or not t0s:
        return []
    width = end / points
    acc = [[0.0, 0.0, 0.0, 0.0, 0.0] for _ in range(points)]  # used, held, running, waiting, peak
    for t0, dt, u, h, n, w in zip(t0s, dts, used, held, running, waiting, strict=True):
        k = min(int(t0 / width), points - 1)
        t, stop = t0, t0 + dt
        while True:
            edge = (k + 1) * width if k < points - 1 else stop
            part = min(stop, edge) - t
            a = acc[k]
            a[0] += u * part
            a[1] += h * part
            a[2] += n * part
            a[3] += w * part
            a[4] = max(a[4], u)
            if stop <= edge or k == points - 1:
                break
            t, k = edge, k + 1
    scale = 100.0 / capacity_blocks
    return [
        {
            "t_s": round(k * width / 1e6, 6),
            "kv_used_mean_pct": round(a[0] / width * scale, 4),
            "kv_used_peak_pct": round(a[4] * scale, 4),
            "kv_held_mean_pct": round(a[1] / width * scale, 4),
            "running_mean": round(a[2] / width, 4),
            "waiting_mean": round(a[3] / width, 4),
        }
        for k, a in enumerate(acc)
    ]
