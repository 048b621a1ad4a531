"""Where a serving run's time went: per timeline bucket and summed (``timeline.jsonl``, summary).

Each iteration's :meth:`~cpkv.serving.cost.base.IterationCost.breakdown` (time, the parts,
model FLOPs: 8 doubles, :data:`FIELDS`) is computed from its cost arguments when the run's
spilled samples are read back (:func:`breakdown_rows`), a chunk at a time, and summed by
:class:`BreakdownBuckets` in iteration order.

Per bucket of the timeline (``admit.serving.timeline_points`` equal spans of [0, makespan];
an iteration that spans a bucket edge is split by time, each part in proportion):
``<part>_ms`` (time in each of :data:`~cpkv.serving.cost.base.PARTS`), ``busy_pct`` (iteration
time / bucket span) and ``mfu_pct`` (model FLOPs / (bucket span x peak FLOP/s of all GPUs);
null without FLOPs). Summed (the summary's ``time``, :func:`summed_time`): ``busy_s``,
``busy_pct`` (of the makespan), ``<part>_s`` and ``<part>_pct`` (of the busy time),
``model_tflop``, ``mfu_pct`` (over the makespan) and ``mfu_busy_pct`` (over the busy time).
"""

from __future__ import annotations

from typing import Any

from cpkv.core.schema import to_dict
from cpkv.serving.cost.base import PARTS
from cpkv.serving.cost.roofline import mfu_pct

FIELDS = 8  # time, the six parts, FLOPs


class BreakdownBuckets:
    """The breakdown of one run whose makespan is ``end_us``, fed its iterations in order, a
    chunk at a time (:meth:`add`), float for float the numbers of the loop over all of them
    over a whole run's rows is: per bucket, the iterations that stop inside their first
    bucket (or start in the last) add their whole rows one by one in iteration order, then those that cross an edge add their pieces, in iteration
    order (a bucket edge is crossed by at most one iteration: there are fewer of them than
    buckets, and they are kept until :meth:`rows`). The sums over the run (:meth:`summary`)
    are sequential in iteration order too (as ``sum(axis=0)`` of the rows)."""

    def __init__(self, end_us: float, points: int, peak_flops_per_us: float | None) -> None:
        import numpy as np

        self.end_us, self.points, self.peak = end_us, points, peak_flops_per_us
        self.width = end_us / points if end_us > 0 else 0.0
        self.acc = np.zeros((points, FIELDS))
        self.totals = np.zeros(FIELDS)
        self.crossing: list[tuple[int, float, Any]] = []  # (first bucket, start, row)
        self.iterations = 0

    def add(self, starts_us: Any, rows: Any) -> None:
        """The next iterations: their start times and their ``(n, 8)`` breakdown rows."""
        import numpy as np

        n = len(rows)
        if not n:
            return
        self.iterations += n
        if not rows.flags.writeable:
            rows = rows.copy()
        head = rows[0].copy()  # the sums start from the totals so far: in the first row
        rows[0] = self.totals + head
        self.totals = _row_sum(rows)
        rows[0] = head
        if self.end_us <= 0:
            return
        points, width = self.points, self.width
        start = np.asarray(starts_us, dtype=float)
        first = np.minimum((start / width).astype(np.int64), points - 1)
        stop = start + rows[:, 0]
        edge = np.where(first < points - 1, (first + 1) * width, np.inf)
        whole = stop <= edge
        # bucket by bucket (the start times never decrease: each bucket's rows are a run),
        # its whole rows: the run itself when none crosses an edge (the commonest case, no
        # copy), else the whole ones picked out
        cuts = (np.flatnonzero(first[1:] != first[:-1]) + 1).tolist()
        acc = self.acc
        for a, b in zip([0, *cuts], [*cuts, n], strict=True):
            weights = rows[a:b] if whole[a:b].all() else rows[a:b][whole[a:b]]
            if not len(weights):
                continue
            k = int(first[a])
            head = weights[0].copy()
            weights[0] = acc[k] + head
            acc[k] = _row_sum(weights)
            weights[0] = head  # (``rows`` is ours, but its crossing rows are kept below)
        for i in np.flatnonzero(~whole).tolist():
            self.crossing.append((int(first[i]), float(start[i]), rows[i].copy()))

    def rows(self) -> list[dict[str, float | None]]:
        """Per timeline bucket: time in each part (ms), busy and MFU percentages (see the
        module docstring); none when no iteration ran or the makespan is 0."""
        if self.end_us <= 0 or not self.iterations:
            return []
        width = self.width
        out = []
        for a in self.sums():
            row: dict[str, float | None] = {
                f"{p}_ms": round(float(a[1 + j]) / 1000.0, 4) for j, p in enumerate(PARTS)
            }
            row["busy_pct"] = round(100.0 * float(a[0]) / width, 4)
            mfu = mfu_pct(float(a[7]), width / 1e6, self.peak)
            row["mfu_pct"] = None if mfu is None else round(mfu, 4)
            out.append(row)
        return out

    def sums(self) -> Any:
        """The ``(points, 8)`` sums per bucket, the iterations that cross an edge included."""
        acc, points, width = self.acc.copy(), self.points, self.width
        for k, t, rec in self.crossing:  # split by time
            dt = float(rec[0])
            stop = t + dt
            while True:
                bucket_edge = (k + 1) * width if k < points - 1 else stop
                part = min(stop, bucket_edge) - t
                acc[k] += rec * (part / dt)
                if stop <= bucket_edge or k == points - 1:
                    break
                t, k = bucket_edge, k + 1
        return acc

    def summary(self) -> dict[str, float | None]:
        """The run's time, summed: busy, each part, model FLOPs and MFU (module docstring)."""
        return summed_time(self.totals, self.end_us, self.peak)


def _sequential_rows() -> bool:
    """Whether ``sum(axis=0)`` of a C-ordered ``(n, 8)`` array adds its rows one by one, in
    order (numpy reduces over the outer axis that way; only a reduction along a contiguous
    axis is pairwise), tried on values whose sum depends on the order."""
    import numpy as np

    probe = np.tile(np.array([[1.0], [1e-16], [-1.0], [1e-16]] * 64), (1, FIELDS))
    probe[::5] *= 3.0
    return bool(np.array_equal(probe.sum(axis=0), np.cumsum(probe, axis=0)[-1]))


def _row_sum(rows: Any) -> Any:
    """The sum of the rows of ``rows``, added one by one in order."""
    import numpy as np

    if _SEQUENTIAL_ROWS[0] is None:
        _SEQUENTIAL_ROWS[0] = _sequential_rows()
    return rows.sum(axis=0) if _SEQUENTIAL_ROWS[0] else np.cumsum(rows, axis=0)[-1]


_SEQUENTIAL_ROWS: list[bool | None] = [None]


def summed_time(totals: Any, end_us: float, peak: float | None) -> dict[str, float | None]:
    busy_us = float(totals[0])
    out: dict[str, float | None] = {
        "busy_s": round(busy_us / 1e6, 6),
        "busy_pct": round(100.0 * busy_us / end_us, 4) if end_us > 0 else None,
    }
    for j, part in enumerate(PARTS):
        out[f"{part}_s"] = round(float(totals[1 + j]) / 1e6, 6)
    for j, part in enumerate(PARTS):
        out[f"{part}_pct"] = (
            round(100.0 * float(totals[1 + j]) / busy_us, 4) if busy_us > 0 else None
        )
    flops = float(totals[7])
    out["model_tflop"] = round(flops / 1e12, 6) if peak is not None else None
    for key, seconds in (("mfu_pct", end_us / 1e6), ("mfu_busy_pct", busy_us / 1e6)):
        mfu = mfu_pct(flops, seconds, peak)
        out[key] = None if mfu is None else round(mfu, 4)
    return out


def breakdown_rows(model: Any, *arguments: Any) -> Any:
    """``(n, 8)`` breakdown rows of ``n`` iterations given as six integer arrays (the
    arguments of ``batch_us``): the model's own ``breakdowns`` when it has one, else its
    ``breakdown`` iteration by iteration."""
    import numpy as np

    many = getattr(model, "breakdowns", None)
    if many is not None:
        return many(*arguments)
    rows = [model.breakdown(*(int(v) for v in args)) for args in zip(*arguments, strict=True)]
    return np.array(rows, dtype=float).reshape(-1, FIELDS)


def time_note(time: dict[str, Any]) -> str:
    """One line of the summed time, for the run's notes."""
    busy = time["busy_pct"]
    parts = ", ".join(f"{p} {time[f'{p}_pct']:.1f}%" for p in PARTS if time[f"{p}_pct"] is not None)
    line = f"time breakdown: GPU busy {'-' if busy is None else f'{busy:.1f}%'} of the makespan"
    if parts:
        line += f"; of the busy time {parts}"
    if time["mfu_pct"] is None:
        return line + "; MFU: - (this cost model counts no FLOPs)"
    busy_mfu = time["mfu_busy_pct"]
    shown = "-" if busy_mfu is None else f"{busy_mfu:.2f}%"
    return line + f"; MFU {time['mfu_pct']:.2f}% ({shown} of the busy time)"


def cost_note(model: Any) -> str:
    """One line naming a roofline model's deployment and calibration, for the run's notes."""
    name, gpu = model.names
    cal = model.calibration
    shown = ", ".join(f"{k}={v:g}" for k, v in to_dict(cal).items())
    return (
        f"cost model roofline: {name or 'an inline model shape'} on {model.tp} x {gpu} "
        f"(TP {model.tp}), KV {model.kv_bytes_per_token} bytes/token; linear layers, "
        "elementwise kernels and all-reduce calibrated on measured GPU profiles; attention, "
        f"load-back and the per-iteration overhead modelled; calibration: {shown}"
    )
