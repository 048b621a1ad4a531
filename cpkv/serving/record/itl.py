"""Inter-token latency (ITL): every gap between two consecutive output tokens of a finished
request, pooled over the run's requests, as engines' benchmark tools report it (vLLM's
``benchmark_serving``, SGLang's ``bench_serving``): the mean, p50, p90, p99 and max.

The gaps are the instances' :class:`~cpkv.serving.record.token_gaps.GapLog` records: weighted
values and weighted lines of values, tens of millions of gaps in a long run, never one array
a token. The statistics are exact, from all the gaps:

* the count and the mean: summed over the records' values (each expanded with numpy, a batch
  of records at a time);
* a percentile interpolates linearly between two order statistics of the sorted gaps (rank
  ``q / 100 * (n - 1)``, numpy's default and :func:`~cpkv.serving.record.requests.
  percentile`'s); the max is the last one. An order statistic is found by its value's bits
  (a non-negative float orders as its bit pattern): one pass over the records counts the
  gaps in fine bins of the bit patterns (at most :data:`BINS` over the logged range); a bin
  that holds an order statistic is then resolved by a pass that either collects its values
  (when it holds at most :data:`COLLECT` gaps: sorted, the statistic read off) or counts
  them in bins :data:`REFINE_BITS` bits finer, until a bin holds one value. A pass reads
  only the records whose values reach a bin it resolves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cpkv.serving.record.token_gaps import GapLog, expand

QUANTILES = (50, 90, 99)
BINS = 1 << 16
"""The most bins of the first pass."""
COLLECT = 1 << 18
"""The most values a bin may hold to be resolved by collecting them."""
REFINE_BITS = 16
"""How much finer a refining pass's bins are (bits of the value's pattern)."""


@dataclass(frozen=True)
class ItlStats:
    """The pooled gaps of a run (ms; None when no request had two tokens)."""

    gaps: int = 0
    mean_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None

    def summary(self) -> dict[str, float | None]:
        """``results.json``'s ``itl_ms``."""
        return {
            "mean": self.mean_ms, "p50": self.p50_ms, "p90": self.p90_ms, "p99": self.p99_ms,
            "max": self.max_ms,
        }  # fmt: skip

    def columns(self) -> dict[str, float | None]:
        """The summary row's ``itl_*_ms`` columns."""
        return {f"itl_{k}_ms": v for k, v in self.summary().items()}


def itl_stats(iteration_logs: Sequence[Any]) -> ItlStats:
    """The ITL of the instances whose iterations ``iteration_logs`` logged (one run; their
    :class:`~cpkv.serving.record.iteration_log.IterationLog`, each holding its token gaps;
    see the module docstring)."""
    logs = [log.settle_gaps() for log in iteration_logs]
    sources = [(log, log.withdrawals()) for log in logs]
    for log in logs:
        log.flush()
    low = min((log.low for log in logs), default=np.inf)
    high = max((log.high for log in logs), default=-np.inf)
    if not low <= high:
        return ItlStats()
    if low < 0 or not np.isfinite(high):
        raise RuntimeError(f"internal error: token gaps from {low} to {high} us")
    shift = _first_shift(_bits(low), _bits(high))
    count, total, bins = _first_pass(sources, shift, _bits(low) >> shift)
    if count <= 0:
        return ItlStats()
    ranks: dict[int, float] = {}
    for q in QUANTILES:
        rank = q / 100.0 * (count - 1)
        lo = int(rank)
        ranks[lo] = ranks[min(lo + 1, count - 1)] = 0.0
    ranks[count - 1] = 0.0
    values = _order_statistics(sources, sorted(ranks), shift, bins)

    def percentile(q: float) -> float:
        rank = q / 100.0 * (count - 1)
        lo = int(rank)
        a, b = values[lo], values[min(lo + 1, count - 1)]
        return (a + (b - a) * (rank - lo)) / 1000.0

    return ItlStats(
        count, total / count / 1000.0, *(percentile(q) for q in QUANTILES),
        values[count - 1] / 1000.0,
    )  # fmt: skip


def _bits(value: float) -> int:
    return int(np.array(value, dtype=np.float64).view(np.int64))


def _first_shift(low: int, high: int) -> int:
    """The finest bins of the bit patterns (a right shift) that cover ``low`` .. ``high`` in
    at most :data:`BINS` bins."""
    shift = 0
    while (high >> shift) - (low >> shift) >= BINS:
        shift += 1
    return shift


@dataclass
class _Bins:
    """Counts of gaps in the bins ``key >> shift == base + i`` (float64: whole numbers,
    exact below 2**53)."""

    shift: int
    base: int
    weights: np.ndarray

    @classmethod
    def empty(cls, shift: int, base: int, size: int) -> _Bins:
        return cls(shift, base, np.zeros(size))

    def add(self, keys: np.ndarray, weights: np.ndarray) -> None:
        """Count the values of bit patterns ``keys`` (inside these bins)."""
        if not len(keys):
            return
        i = (keys >> self.shift) - self.base
        first = int(i.min())
        counts = np.bincount(i - first, weights)
        self.weights[first : first + len(counts)] += counts


def _first_pass(sources: list[tuple[GapLog, Any]], shift: int, base: int):
    """The count of gaps, their sum (µs) and their bins."""
    count, total = 0, 0.0
    bins: _Bins | None = None
    for log, withdrawals in sources:
        if not log.high >= log.low:
            continue
        size = int((_bits(log.high) >> shift) - base) + 1
        if bins is None:
            bins = _Bins.empty(shift, base, size)
        elif size > len(bins.weights):
            grown = _Bins.empty(shift, base, size)
            grown.weights[: len(bins.weights)] += bins.weights
            bins = grown
        for rec in log.records():
            values, weights = expand(rec, withdrawals)
            count += int(weights.sum())
            total += float((values * weights).sum())
            bins.add(values.view(np.int64), weights)
    if bins is not None and np.any(bins.weights < 0):
        raise RuntimeError("internal error: more token gaps withdrawn than logged")
    return count, total, bins


def _order_statistics(
    sources: list[tuple[GapLog, Any]], ranks: list[int], shift: int, bins: _Bins
) -> dict[int, float]:
    """The gaps of 0-based ``ranks`` in sorted order (µs), from the first pass's bins."""
    found: dict[int, float] = {}
    pending = _locate(ranks, bins)  # rank -> (bin key, shift, rank within the bin, gaps)
    while pending:
        groups: dict[tuple[int, int], list[int]] = {}
        for rank, (key, at, _, _) in pending.items():
            groups.setdefault((key, at), []).append(rank)
        for (key, at), members in list(groups.items()):
            if at == 0:  # a bin of one bit pattern: its value
                for rank in members:
                    found[rank] = float(np.array(key, np.int64).view(np.float64))
                del groups[(key, at)]
        if not groups:
            break
        collect = {g for g, members in groups.items() if pending[members[0]][3] <= COLLECT}
        gathered, refined = _pass(sources, groups, collect)
        following: dict[int, tuple[int, int, int, int]] = {}
        for group, members in groups.items():
            if group in collect:
                values, weights = gathered[group]
                order = np.cumsum(weights)
                for rank in members:
                    inside = pending[rank][2]
                    found[rank] = float(values[np.searchsorted(order, inside, "right")])
            else:
                for rank in members:
                    inside = pending[rank][2]
                    key, at, deeper, entries = _locate([inside], refined[group])[inside]
                    following[rank] = (key, at, deeper, entries)
        pending = following
    return found


def _locate(ranks: list[int], bins: _Bins) -> dict[int, tuple[int, int, int, int]]:
    """Each rank's bin: ``(key, shift, rank within the bin, gaps in the bin)``."""
    order = np.cumsum(bins.weights)
    out = {}
    for rank in ranks:
        i = int(np.searchsorted(order, rank, "right"))
        before = int(order[i - 1]) if i else 0
        out[rank] = (bins.base + i, bins.shift, rank - before, int(bins.weights[i]))
    return out


def _pass(
    sources: list[tuple[GapLog, Any]], groups: dict[tuple[int, int], list[int]], collect: set
) -> tuple[dict, dict]:
    """One pass over the records that reach the bins ``groups``: the values of those in
    ``collect`` (distinct, sorted, with their gaps), finer bins of the others."""
    ranges = {g: (g[0] << g[1], ((g[0] + 1) << g[1]) - 1) for g in groups}
    parts: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray]]] = {g: [] for g in collect}
    refined: dict[tuple[int, int], _Bins] = {}
    for key, at in groups:
        if (key, at) not in collect:
            finer = max(0, at - REFINE_BITS)
            refined[(key, at)] = _Bins.empty(finer, key << (at - finer), 1 << (at - finer))
    lows = np.array([r[0] for r in ranges.values()], np.int64)
    highs = np.array([r[1] for r in ranges.values()], np.int64)
    for log, withdrawals in sources:
        for rec in log.records():
            low, high = rec.ends()
            first, last = low.view(np.int64), high.view(np.int64)
            reach = np.any((last[:, None] >= lows) & (first[:, None] <= highs), axis=1)
            if not reach.any():
                continue
            values, weights = expand(rec.subset(reach), withdrawals)
            keys = values.view(np.int64)
            for group, (lo, hi) in ranges.items():
                inside = (keys >= lo) & (keys <= hi)
                if group in parts:
                    inside &= weights != 0
                if not inside.any():
                    continue
                if group in parts:
                    parts[group].append((values[inside], weights[inside]))
                else:
                    refined[group].add(keys[inside], weights[inside])
    gathered = {}
    for group, pieces in parts.items():
        values = np.concatenate([p[0] for p in pieces])
        weights = np.concatenate([p[1] for p in pieces])
        distinct, where = np.unique(values, return_inverse=True)
        totals = np.bincount(where, weights, len(distinct)).astype(np.int64)
        keep = totals > 0
        gathered[group] = (distinct[keep], totals[keep])
    return gathered, refined
