"""Trace statistics and the hit-ratio-against-capacity curve (Mooncake FAST'25 Figure 9 style).

The cache ratio is token weighted: cached prompt tokens / prompt tokens over all requests, where
a request's cached tokens are `l1 + l2` of its `cpkv.trace.prefix_cache` lookup (longest run of leading
blocks already cached, capped at `input_length - 1`, page aligned). On the Mooncake synthetic
trace with unlimited capacity this gives 65.1%, the paper's Table 2 "66%"; the block-count ratio
(63.96%) and the mean of per-request ratios (43.1%) do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpkv.core.errors import ConfigError
from cpkv.core.timing import percentile
from cpkv.runs.results import metric
from cpkv.trace.prefix_cache import CacheConfig, CachedRequest, TieredPrefixCache, replay
from cpkv.trace.readers import Trace

DEFAULT_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class TraceStats:
    """Summary of a trace and its cache ratios (unlimited, and at the configured capacities)."""

    requests: int
    prompt_tokens: int
    input_mean_tokens: float
    input_p50_tokens: float
    input_p99_tokens: float
    output_mean_tokens: float
    output_p50_tokens: float
    output_p99_tokens: float
    arrival_span_ms: float
    arrival_rate_per_s: float | None
    unique_blocks: int
    working_set_tokens: int
    unlimited_cache_pct: float
    l1_tokens: int | None
    l2_tokens: int | None
    page_size: int
    l1_hit_pct: float
    l2_hit_pct: float
    cache_pct: float


@dataclass(frozen=True)
class CurvePoint:
    """The hit ratio at one cache capacity (L1 = capacity_pct % of the working set, L2 = ratio x
    L1 or off). Hit percentages are cached tokens per 100 prompt tokens."""

    capacity_pct: float
    l1_tokens: int
    l2_tokens: int
    l1_hit_pct: float = metric(unit="%", lower_is_better=False)
    l2_hit_pct: float = metric(unit="%", lower_is_better=False)
    cache_pct: float = metric(unit="%", lower_is_better=False)


def hit_ratios(requests: Sequence[CachedRequest]) -> tuple[float, float]:
    """(L1 hit tokens, L2 hit tokens), each divided by all prompt tokens (fractions)."""
    prompt = sum(r.input_length for r in requests)
    if prompt == 0:
        return 0.0, 0.0
    l1 = sum(r.l1_cached_tokens for r in requests)
    l2 = sum(r.l2_cached_tokens for r in requests)
    return l1 / prompt, l2 / prompt


def working_set(trace: Trace) -> tuple[int, int]:
    """(unique blocks, tokens they hold): what an unlimited cache holds after the trace."""
    cache = TieredPrefixCache(trace.block_size, CacheConfig())
    for req in trace.requests:
        cache.insert(req.hash_ids, req.input_length)
    return len(cache.l1.blocks), cache.l1.used


def trace_stats(trace: Trace, config: CacheConfig) -> TraceStats:
    """Lengths, arrivals and cache ratios of a trace (`config` gives the tiered capacities)."""
    reqs = trace.requests
    if not reqs:
        raise ValueError("trace_stats needs at least one request")
    inputs = [r.input_length for r in reqs]
    outputs = [r.output_length for r in reqs]
    stamps = [r.arrival_ms for r in reqs]
    span = max(stamps) - min(stamps)
    rate = (len(reqs) - 1) / (span / 1000) if span > 0 else None
    unlimited = sum(hit_ratios(replay(trace, CacheConfig(page_size=config.page_size))))
    l1_cap, l2_cap = config.capacities()
    l1, l2 = hit_ratios(replay(trace, config))
    blocks, tokens = working_set(trace)
    return TraceStats(
        requests=len(reqs),
        prompt_tokens=sum(inputs),
        input_mean_tokens=sum(inputs) / len(reqs),
        input_p50_tokens=percentile(inputs, 50),
        input_p99_tokens=percentile(inputs, 99),
        output_mean_tokens=sum(outputs) / len(reqs),
        output_p50_tokens=percentile(outputs, 50),
        output_p99_tokens=percentile(outputs, 99),
        arrival_span_ms=span,
        arrival_rate_per_s=rate,
        unique_blocks=blocks,
        working_set_tokens=tokens,
        unlimited_cache_pct=100 * unlimited,
        l1_tokens=l1_cap,
        l2_tokens=l2_cap,
        page_size=config.page_size,
        l1_hit_pct=100 * l1,
        l2_hit_pct=100 * l2,
        cache_pct=100 * (l1 + l2),
    )


def capacity_curve(
    trace: Trace,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    hicache_ratio: float | None = None,
    page_size: int = 1,
) -> tuple[CurvePoint, ...]:
    """Hit ratio against L1 capacity = fraction x working-set tokens, one replay per point.

    Without `hicache_ratio` the cache is single tier (L2 off), as in the Mooncake paper's
    Figure 9; with it, L2 = floor(ratio x L1) and the rows split the hits by tier.
    """
    for f in fractions:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not f >= 0:
            raise ConfigError(f"curve fraction {f!r} is not allowed; use numbers >= 0")
    tokens = working_set(trace)[1]
    points = []
    for f in fractions:
        l1_cap = int(f * tokens)
        if hicache_ratio is None:
            config = CacheConfig(l1_tokens=l1_cap, l2_tokens=0, page_size=page_size)
        else:
            config = CacheConfig(l1_tokens=l1_cap, hicache_ratio=hicache_ratio, page_size=page_size)
        l2_cap = config.capacities()[1]
        l1, l2 = hit_ratios(replay(trace, config))
        points.append(CurvePoint(100 * f, l1_cap, l2_cap, 100 * l1, 100 * l2, 100 * (l1 + l2)))
    return tuple(points)
