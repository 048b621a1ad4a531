"""The timeline of a serving run (``timeline.jsonl``): ``points`` equal buckets of
[0, makespan], each with the KV utilisation and where the time went.

An iteration starting at ``t0`` lies in bucket ``min(int(t0 / width), points - 1)`` and adds
``value x part`` to each bucket it overlaps, ``part`` being the time it spends there (the
last bucket takes everything from its start on): for the KV blocks used and held and the
requests running and waiting; a bucket's peak is the highest used count of the iterations
in it. Its time breakdown (the cost model's parts, :data:`~cpkv.serving.cost.base.PARTS`,
and the model FLOPs) goes to its buckets the same way, split in proportion to the time
spent in each. Per bucket (:meth:`TimelineSums.rows`): ``t_s`` (the bucket's start),
``kv_used_mean_pct``, ``kv_used_peak_pct``, ``kv_held_mean_pct``, ``running_mean``,
``waiting_mean`` (time-weighted over the bucket), ``<part>_ms``, ``busy_pct``, ``mfu_pct``
(:func:`~cpkv.serving.cost.report.breakdown_row`).

Most iterations lie inside one bucket: the iterations come in time order, and each run of
them that starts in one bucket is summed at once (``np.add.reduceat``); the few that cross
an edge are then taken out of their first bucket and split one by one (the sums agree with
adding each part in turn within rounding).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cpkv.serving.cost.report import FIELDS, breakdown_row


class TimelineSums:
    """The buckets of a run whose makespan is ``end_us`` (> 0), fed its iterations a batch
    at a time in order (:meth:`add`)."""

    def __init__(self, end_us: float, points: int) -> None:
        self.width = end_us / points
        self.points, self.last = points, points - 1
        self.kv = np.zeros((points, 4))  # used, held, running, waiting (x time)
        self.peak = np.zeros(points, dtype=np.int64)
        self.parts = np.zeros((points, FIELDS))  # time, the six parts, FLOPs
        self.seen = False

    def add(self, t0: Any, dt: Any, series: tuple[Any, ...], columns: list[Any]) -> None:
        """The next iterations: starts, durations, the four counts, the breakdown columns
        (arrays, or one float for every iteration)."""
        n = len(t0)
        if not n:
            return
        self.seen = True
        width = self.width
        bucket = np.minimum((t0 / width).astype(np.int64), self.last)
        stop = t0 + dt
        crossing = (bucket < self.last) & (stop > (bucket + 1) * width)
        # each run of iterations in one bucket (the iterations come in time order: a run a
        # bucket) summed at once, every iteration into its first bucket ...
        starts = np.concatenate(([0], np.flatnonzero(bucket[1:] != bucket[:-1]) + 1))
        k = bucket[starts]
        for s, values in enumerate(series):
            np.add.at(self.kv[:, s], k, np.add.reduceat(values * dt, starts))
        np.maximum.at(self.peak, k, np.maximum.reduceat(series[0], starts))
        count = np.diff(np.append(starts, n))
        for c, column in enumerate(columns):
            if isinstance(column, float):
                if column:
                    np.add.at(self.parts[:, c], k, column * count)
            else:
                np.add.at(self.parts[:, c], k, np.add.reduceat(column, starts))
        # ... then an iteration that crosses an edge taken out of it and split over its buckets
        for i in np.flatnonzero(crossing).tolist():
            values = np.array([float(v[i]) for v in series])
            row = np.array([c if isinstance(c, float) else float(c[i]) for c in columns])
            first = int(bucket[i])
            self.kv[first] -= values * float(dt[i])
            self.parts[first] -= row
            self._split(float(t0[i]), float(stop[i]), first, values, row)

    def _split(self, t: float, stop: float, k: int, values: Any, row: Any) -> None:
        """An iteration from ``t`` to ``stop`` (first bucket ``k``) that crosses an edge."""
        duration = stop - t
        while True:
            edge = (k + 1) * self.width if k < self.last else stop
            part = min(stop, edge) - t
            self.kv[k] += values * part
            self.peak[k] = max(self.peak[k], int(values[0]))
            self.parts[k] += row * (part / duration)
            if stop <= edge or k == self.last:
                return
            t, k = edge, k + 1

    def rows(self, capacity_blocks: int, peak_flops_per_us: float | None) -> list[dict[str, Any]]:
        """The timeline's points (none when no iteration ran)."""
        if not self.seen:
            return []
        width = self.width
        scale = 100.0 / capacity_blocks
        out = []
        for k in range(self.points):
            a = self.kv[k]
            row: dict[str, Any] = {
                "t_s": round(k * width / 1e6, 6),
                "kv_used_mean_pct": round(float(a[0]) / width * scale, 4),
                "kv_used_peak_pct": round(int(self.peak[k]) * scale, 4),
                "kv_held_mean_pct": round(float(a[1]) / width * scale, 4),
                "running_mean": round(float(a[2]) / width, 4),
                "waiting_mean": round(float(a[3]) / width, 4),
            }
            row.update(breakdown_row(self.parts[k], width, peak_flops_per_us))
            out.append(row)
        return out
