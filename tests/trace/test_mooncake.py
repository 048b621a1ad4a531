"""The public Mooncake synthetic trace (read from ../shared/data, never copied): the reader,
the paper's cache ratio, and the stats and curve computations against independent references."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from cpkv.trace.prefix_cache import CacheConfig, replay
from cpkv.trace.readers import read_trace
from cpkv.trace.stats import capacity_curve, trace_stats
from tests.helpers.paths import MOONCAKE_TRACE

TRACE = Path(
    os.environ.get(
        "CPKV_MOONCAKE_TRACE",
        MOONCAKE_TRACE,
    )
)
BLOCK = 512
pytestmark = pytest.mark.skipif(not TRACE.is_file(), reason=f"trace not found at {TRACE}")


@pytest.fixture(scope="module")
def trace():
    return read_trace(TRACE, "mooncake", BLOCK)


@pytest.fixture(scope="module")
def rows():
    with TRACE.open() as lines:
        return [json.loads(line) for line in lines if line.strip()]


def brute_force_ratio(rows, page=1):
    """Cached prompt tokens / prompt tokens with unlimited capacity, from the definition: the
    longest run of leading blocks seen before, in tokens (the last block covers the rest of the
    prompt), capped at input_length - 1, rounded down to pages."""
    seen: set[int] = set()
    cached = prompt = 0
    for r in rows:
        run = 0
        for h in r["hash_ids"]:
            if h not in seen:
                break
            run += 1
        cached += min(run * BLOCK, r["input_length"], r["input_length"] - 1) // page * page
        prompt += r["input_length"]
        seen.update(r["hash_ids"])
    return cached / prompt


def test_reader_keeps_every_request_in_order(trace, rows):
    assert len(trace.requests) == len(rows) == 3993
    for i, (req, r) in enumerate(zip(trace.requests, rows, strict=True)):
        assert req.index == i
        assert (req.arrival_ms, req.input_length, req.output_length) == (
            r["timestamp"],
            r["input_length"],
            r["output_length"],
        )
        assert req.hash_ids == tuple(r["hash_ids"])


@pytest.mark.parametrize("page", [1, 64])
def test_unlimited_cache_ratio_is_the_papers_66_percent(trace, rows, page):
    got = replay(trace, CacheConfig(page_size=page))
    ratio = sum(r.l1_cached_tokens for r in got) / sum(r.input_length for r in got)
    assert ratio == pytest.approx(brute_force_ratio(rows, page), abs=1e-12)
    assert abs(ratio - 0.66) <= 0.02  # Mooncake FAST'25, Table 2, synthetic workload
    for r in got:
        assert r.l2_cached_tokens == 0
        assert r.l1_cached_tokens + r.extend_tokens == r.input_length and r.extend_tokens >= 1


def test_stats_against_numpy(trace, rows):
    stats = trace_stats(trace, CacheConfig(l1_tokens=2_000_000, hicache_ratio=2.0))
    inputs = np.array([r["input_length"] for r in rows])
    outputs = np.array([r["output_length"] for r in rows])
    stamps = np.array([r["timestamp"] for r in rows])
    assert stats.requests == 3993 and stats.prompt_tokens == inputs.sum()
    assert stats.input_mean_tokens == pytest.approx(inputs.mean())
    assert stats.input_p50_tokens == pytest.approx(np.percentile(inputs, 50))
    assert stats.input_p99_tokens == pytest.approx(np.percentile(inputs, 99))
    assert stats.output_mean_tokens == pytest.approx(outputs.mean())
    assert stats.output_p99_tokens == pytest.approx(np.percentile(outputs, 99))
    span = stamps.max() - stamps.min()
    assert stats.arrival_span_ms == span
    assert stats.arrival_rate_per_s == pytest.approx((len(rows) - 1) / (span / 1000))
    assert stats.unlimited_cache_pct == pytest.approx(100 * brute_force_ratio(rows))
    assert stats.unique_blocks == len({h for r in rows for h in r["hash_ids"]})
    assert (stats.l1_tokens, stats.l2_tokens) == (2_000_000, 4_000_000)
    assert 0 < stats.l1_hit_pct and 0 < stats.l2_hit_pct
    assert stats.cache_pct == pytest.approx(stats.l1_hit_pct + stats.l2_hit_pct)
    assert stats.cache_pct < stats.unlimited_cache_pct


@pytest.mark.slow
def test_capacity_curve_rises_to_the_unlimited_ratio(trace, rows):
    points = capacity_curve(trace, (0.05, 0.2, 0.5, 1.0))
    hits = [p.cache_pct for p in points]
    assert hits == sorted(hits)  # LRU: more room never hits less
    assert all(p.l2_tokens == 0 and p.l2_hit_pct == 0 for p in points)
    # a cache as large as the working set never evicts: the unlimited ratio
    assert hits[-1] == pytest.approx(100 * brute_force_ratio(rows))
    (tiered,) = capacity_curve(trace, (0.05,), hicache_ratio=2.0)
    assert tiered.l1_tokens == points[0].l1_tokens and tiered.l2_tokens == 2 * tiered.l1_tokens
    assert tiered.l1_hit_pct == pytest.approx(points[0].cache_pct)
    # write-through L1 + L2 hits equal those of a single LRU of the L2 size
    single = replay(trace, CacheConfig(l1_tokens=tiered.l2_tokens, l2_tokens=0))
    cached = sum(r.l1_cached_tokens for r in single) / sum(r.input_length for r in single)
    assert tiered.cache_pct == pytest.approx(100 * cached)
