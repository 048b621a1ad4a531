"""The KV-utilisation timeline of a serving run (``timeline.jsonl``): ``points`` equal buckets of
[0, makespan], from the iterations' samples read in order, a chunk at a time.

The numbers are those of a loop over the iterations (:func:`bucket_pieces` is that loop for
one iteration): an iteration starting at ``t0`` lies in bucket ``min(int(t0 / width),
points - 1)`` and adds ``value x part`` to each bucket it overlaps, ``part`` being
``min(stop, edge) - t`` of its piece there (``stop = t0 + dt``; ``edge = (k + 1) x width``,
the last bucket's edge is ``stop``); each bucket adds its pieces one by one, in iteration
order. :class:`TimelineBuckets` does the same on arrays, using that the samples are in time
order: start times never decrease (an iteration starts where the previous one stopped, or
later after idle time), so neither do buckets nor stops. A bucket's iterations are a run
found by binary search; only its last few, those whose stop passes the edge (again a binary
search), spill into later buckets, and their later pieces come before the later buckets'
own iterations, as in the loop. Sums are sequential (``np.cumsum``), never pairwise.

:class:`TimelineBuckets` serves runs that kept their samples (:func:`timeline_points`); a
run that spilled them sums its buckets with the time breakdown's in one pass over the file
(:class:`SpilledTimeline`, :mod:`cpkv.serving.bucket_sums`, the same numbers), a long run's
by two processes at once in its helper process.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


class TimelineBuckets:
    """The buckets of one run whose makespan is ``end`` (> 0)."""

    def __init__(self, end: float, points: int) -> None:
        self.width = end / points
        self.points, self.last = points, points - 1
        self.sums = np.zeros((points, 4))  # used, held, running, waiting (x time)
        self.peak: list[float | int] = [0.0] * points
        self.pending: dict[int, list[tuple[float, float, float, float, int]]] = {}
        self.flushed = -1  # buckets up to here have taken their pending pieces
        self.seen = False

    def bucket(self, t0: float) -> int:
        k = int(t0 / self.width)
        return k if k < self.last else self.last

    def add(self, t0, dt, used, held, running, waiting) -> None:
        """The next chunk of samples (arrays, in iteration order)."""
        n = len(t0)
        if not n:
            return
        self.seen = True
        width, last, bucket = self.width, self.last, self.bucket
        stop = t0 + dt
        first, final = bucket(float(t0[0])), bucket(float(t0[-1]))
        bounds = bucket_starts(t0, first, final, bucket, width)
        series = (used, held, running, waiting)
        for k in range(first, final + 1):
            a, b = bounds[k - first], bounds[k - first + 1]
            self._take_pending(k)
            if a == b:
                continue
            if k < last:
                edge = (k + 1) * width
                c = a + int(np.searchsorted(stop[a:b], edge, side="right"))  # stop <= edge
            else:
                edge, c = 0.0, b
            part = stop[a:c] - t0[a:c]
            if c < b:  # the first piece of those that run on: up to the edge
                part = np.concatenate([part, edge - t0[c:b]])
            for s, values in enumerate(series):
                self._add_sequential(k, s, values[a:b] * part)
            top = int(used[a:b].max())
            if top > self.peak[k]:
                self.peak[k] = top
            for i in range(c, b):  # their later pieces: pending in the later buckets
                pieces = bucket_pieces(
                    float(t0[i]), float(stop[i]), k, width, last,
                    int(used[i]), int(held[i]), int(running[i]), int(waiting[i]),
                )  # fmt: skip
                for kk, piece in pieces[1:]:
                    self.pending.setdefault(kk, []).append(piece)

    def _take_pending(self, upto: int) -> None:
        """Buckets up to ``upto`` add the pieces pending for them (before their own)."""
        for k in range(self.flushed + 1, upto + 1):
            pieces = self.pending.pop(k, None)
            if pieces:
                columns = np.array([p[:4] for p in pieces])
                for s in range(4):
                    self._add_sequential(k, s, columns[:, s])
                top = max(p[4] for p in pieces)
                if top > self.peak[k]:
                    self.peak[k] = top
        self.flushed = max(self.flushed, upto)

    def _add_sequential(self, k: int, s: int, values: np.ndarray) -> None:
        sums = np.empty(len(values) + 1)
        sums[0] = self.sums[k, s]
        sums[1:] = values
        self.sums[k, s] = np.cumsum(sums, out=sums)[-1]

    def rows(self, capacity_blocks: int) -> list[dict[str, float]]:
        """The timeline's points (none when no iteration ran)."""
        self._take_pending(self.last)
        if not self.seen:
            return []
        return kv_rows(self.sums, self.peak, self.width, capacity_blocks)


def kv_rows(
    sums: Any, peak: list[float | int], width: float, capacity_blocks: int
) -> list[dict[str, float]]:
    """The timeline's KV points from the ``(points, 4)`` sums (used, held, running, waiting,
    each x time) and the peaks (used blocks) per bucket of ``width`` µs."""
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
        for k, a in enumerate(sums)
    ]


def bucket_starts(t0: Any, first: int, final: int, bucket: Any, width: float) -> list[int]:
    """Where the buckets ``first..final`` begin in ``t0`` (start times in order, ``first`` the
    bucket of the first, ``final`` of the last; ``bucket`` maps a start to its bucket), and
    ``len(t0)`` after them: a binary search per edge, moved to agree with ``bucket``."""
    n = len(t0)
    bounds = [0]
    for k in range(first + 1, final + 1):  # the first iteration of bucket k
        i = max(bounds[-1], int(np.searchsorted(t0, k * width)))
        while i > bounds[-1] and bucket(float(t0[i - 1])) >= k:
            i -= 1
        while i < n and bucket(float(t0[i])) < k:
            i += 1
        bounds.append(i)
    bounds.append(n)
    return bounds


def bucket_pieces(
    t0: float, stop: float, k: int, width: float, last: int, *values: int
) -> list[tuple[int, tuple[float, float, float, float, int]]]:
    """The pieces of one iteration starting at ``t0`` in bucket ``k`` and stopping at
    ``stop``: ``(bucket, (used x part, held x part, running x part, waiting x part, used))``."""
    used, held, running, waiting = values
    out = []
    t = t0
    while True:
        edge = (k + 1) * width if k < last else stop
        part = min(stop, edge) - t
        out.append((k, (used * part, held * part, running * part, waiting * part, used)))
        if stop <= edge or k == last:
            return out
        t, k = edge, k + 1


def timeline_points(
    chunks: Iterable[tuple[np.ndarray, ...]], end: float, capacity_blocks: int, points: int
) -> list[dict[str, float]]:
    """KV utilisation over time in ``points`` equal buckets of [0, ``end``], from the
    iterations' samples ``(t0, dt, used, held, running, waiting, ...)`` in order."""
    if end <= 0:
        return []
    buckets = TimelineBuckets(end, points)
    for chunk in chunks:
        buckets.add(*chunk[:6])
    return buckets.rows(capacity_blocks)


class SpilledTimeline:
    """``timeline.jsonl``'s points (KV utilisation and where the time went, per bucket) and
    the summary's ``time`` of a run whose :class:`~cpkv.serving.iteration_log.IterationLog`
    spilled its samples: its breakdown was summed over the run as it went; the buckets are
    summed by :meth:`result` (:mod:`cpkv.serving.bucket_sums`; with ``fork``, a long run's
    are summed by two processes: a forked one starts now, so other work done before
    :meth:`result` overlaps it; create this before starting threads)."""

    def __init__(
        self, samples: Any, end: float, capacity_blocks: int, points: int, fork: bool = False
    ) -> None:
        from cpkv.serving.bucket_sums import SpilledBucketSums

        self.samples, self.end, self.capacity, self.points = samples, end, capacity_blocks, points
        spill = samples.spill
        self.sums = None
        if end > 0 and spill is not None and spill.iterations:
            self.sums = SpilledBucketSums(spill, end, points, fork)

    def result(self) -> tuple[list[dict[str, float | None]], dict[str, float | None]]:
        """The points and the ``time``."""
        from cpkv.serving.cost.report import breakdown_row, summed_time

        peak = self.samples.cost.peak_flops_per_us
        time = summed_time(self.samples.time_totals.sums, self.end, peak)
        if self.sums is None:
            return [], time
        kv, peaks, parts = self.sums.result()
        width = self.end / self.points
        rows: list[dict[str, float | None]] = kv_rows(kv, peaks, width, self.capacity)  # type: ignore[assignment]
        for row, sums in zip(rows, parts, strict=True):
            row.update(breakdown_row(sums, width, peak))
        return rows, time


def timeline_and_time(
    samples: Any, end: float, capacity_blocks: int, points: int
) -> tuple[list[dict[str, float | None]], dict[str, float | None]]:
    """:class:`SpilledTimeline`'s result, summed in this process."""
    return SpilledTimeline(samples, end, capacity_blocks, points).result()
