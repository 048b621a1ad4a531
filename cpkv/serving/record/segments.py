"""The segments of an iteration log (:mod:`cpkv.serving.record.iteration_log`) and what
their iterations sum to.

A segment (:data:`SEGMENT`) is one full iteration or one closed-form stretch of ``steps``
iterations whose decode context, prefill context and attention pairs grow by constant steps
and whose blocks grow by counts that repeat with the block size. :func:`summary` reads a
log's batches back once the makespan is known and, batch by batch, expands each segment into
its iterations with numpy (:func:`expand`): their cost arguments, their time breakdowns (the
cost model's vectorised ``breakdowns``, :func:`~cpkv.serving.cost.report.breakdown_columns`:
the durations are the breakdowns' times), their starts (each segment's logged start plus the
durations before them in it), their blocks. Each segment's end is checked against its logged
end (within rounding): an expansion that does not give the engine's own times fails loudly
instead of writing other numbers. From the iterations it sums, in one pass, what the run
reports: the integrals (used and held blocks x time, peaks; :class:`Integrals`), the time
breakdown over the run (:class:`~cpkv.serving.cost.report.TimeTotals`) and the timeline's
buckets (:class:`~cpkv.serving.record.timeline.TimelineSums`).

A segment also carries its one-iteration token gaps (the requests that got a token at the
end of each of its iterations after one at the end of the iteration before; a full
iteration's gap is its duration, ``end - start``, a stretch's are the line
``gap_a + gap_b j``): :func:`segment_gaps` turns a batch's into the gap log's records.

This module is numpy from end to end and runs interpreted (it is not in
:data:`cpkv.native.COMPILED`): compiled, its calls into numpy are slower.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from cpkv.serving.cost.report import TimeTotals, breakdown_columns
from cpkv.serving.record.timeline import TimelineSums
from cpkv.serving.record.token_gaps import GapLog, Gaps

SEGMENT = struct.Struct("<qddqqqqqqqqqqqqqqdd")
"""One segment: steps, start, end (µs), running, waiting (at its first iteration), decode
requests, used and free blocks (after a full iteration's allocations; before a stretch's
first step's growth), prefill tokens, decode context, prefill context, attention pairs, the
pairs' step, loaded tokens, the number of growth counts logged for it (whose needed-block
counts follow them when negative), the number of requests that join the queue within it
(the iterations at whose start each joins follow the counts), its one-iteration token gaps
per iteration and, for a stretch, their line's two numbers."""
SEGMENT_DTYPE = np.dtype(
    [
        ("steps", "<i8"), ("start", "<f8"), ("end", "<f8"), ("running", "<i8"),
        ("waiting", "<i8"), ("decode", "<i8"), ("used", "<i8"), ("free", "<i8"),
        ("prefill", "<i8"), ("decode_context", "<i8"), ("prefill_context", "<i8"),
        ("pairs", "<i8"), ("pairs_step", "<i8"), ("loaded", "<i8"), ("counts", "<i8"),
        ("joins", "<i8"), ("gaps", "<i8"), ("gap_a", "<f8"), ("gap_b", "<f8"),
    ]
)  # fmt: skip
assert SEGMENT_DTYPE.itemsize == SEGMENT.size
TOLERANCE = 1e-9
"""How far (relative) a segment's expanded end may be from the engine's."""


@dataclass
class Integrals:
    """What the summary row needs of the samples (:func:`cpkv.serving.record.metrics.row_of`)."""

    iterations: int = 0
    used_block_us: float = 0.0  # sum of used x duration
    held_block_us: float = 0.0
    used_sum: int = 0  # plain sums (the mean per iteration when the makespan is 0)
    held_sum: int = 0
    used_peak: int = 0


@dataclass
class LogSummary:
    """:meth:`IterationLog.summary`: the integrals, the breakdown summed over the run and
    the timeline's buckets (None when the makespan is 0)."""

    integrals: Integrals
    time_totals: TimeTotals
    timeline: TimelineSums | None


def summary(
    batches: Any, cost: Any, capacity_blocks: int, end_us: float, points: int,
    gaps: GapLog | None = None,
) -> LogSummary:  # fmt: skip
    """Everything a run reports of its iterations (module docstring): ``batches`` (the log's,
    ``(segment bytes, count bytes)`` in order) over a makespan of ``end_us`` and a timeline
    of ``points`` buckets; the segments' token gaps go to ``gaps`` on the way (None: they
    are there already)."""
    totals, time = Integrals(), TimeTotals()
    timeline = TimelineSums(end_us, points) if end_us > 0 else None
    first = 0
    for records, counts in batches:
        if gaps is not None:
            first = segment_gaps(records, first, gaps)
        t0, dt, used, held, running, waiting, columns = expand(
            records, counts, cost, capacity_blocks, True
        )
        totals.iterations += len(dt)
        # (no BLAS dot: numpy's BLAS threads spin for a while after a call, taking a core)
        totals.used_block_us += float((used * dt).sum())
        totals.held_block_us += float((held * dt).sum())
        totals.used_sum += int(used.sum())
        totals.held_sum += int(held.sum())
        totals.used_peak = max(totals.used_peak, int(used.max()))
        if timeline is not None:
            timeline.add(t0, dt, (used, held, running, waiting), columns)
        time.add(columns, len(dt))
    return LogSummary(totals, time, timeline)


def segment_gaps(records: bytes, first: int, gaps: GapLog) -> int:
    """A batch's segments' gaps into ``gaps`` (``first``: the iteration its first segment
    starts at); the iteration after the batch."""
    rec = np.frombuffer(records, dtype=SEGMENT_DTYPE)
    steps = rec["steps"]
    starts = first + np.cumsum(steps) - steps
    some = rec["gaps"] != 0
    if some.any():
        rec, full = rec[some], steps[some] == 1
        gaps.add(Gaps(
            starts[some], np.where(full, rec["end"] - rec["start"], rec["gap_a"]),
            np.where(full, 0.0, rec["gap_b"]), rec["steps"], rec["gaps"].astype(float),
        ))  # fmt: skip
    return first + int(steps.sum())


def expand(
    records: bytes, counts: bytes, cost: Any, capacity_blocks: int, breakdown: bool = False
):  # fmt: skip
    """A batch's iterations: ``(t0, dt, used, held, running, waiting)`` arrays, and the
    breakdown columns (``cost``'s) when asked."""
    rec = np.frombuffer(records, dtype=SEGMENT_DTYPE)
    steps = rec["steps"]
    first = np.cumsum(steps) - steps
    seg = np.repeat(np.arange(len(rec)), steps)  # each iteration's segment
    j = np.arange(len(seg)) - first[seg]

    def each(name: str) -> Any:
        return np.ascontiguousarray(rec[name])[seg]

    prefill, decode = each("prefill"), each("decode")
    arguments = (
        prefill, decode, each("decode_context") + decode * j,
        each("prefill_context") + prefill * j, each("pairs") + each("pairs_step") * j,
        each("loaded"),
    )  # fmt: skip
    columns = breakdown_columns(cost, *arguments)
    dt = np.broadcast_to(columns[0], j.shape).astype(float)
    t0 = _starts(rec, first, steps, seg, dt)
    logged, layout = np.frombuffer(counts, np.int64), _layout(rec)
    used, held = _blocks(rec, first, seg, j, logged, layout, capacity_blocks)
    out = (t0, dt, used, held, each("running"), _waiting(rec, first, seg, logged, layout, each))
    return (*out, columns) if breakdown else out


def _starts(rec: Any, first: Any, steps: Any, seg: Any, dt: Any) -> Any:
    """Each iteration's start: its segment's logged start plus the durations before it in
    the segment (``seg``: each iteration's segment); each segment's end checked against the
    logged one."""
    before = np.cumsum(dt) - dt  # the durations before each iteration, in the batch
    t0 = (rec["start"] - before[first])[seg] + before
    last = first + steps - 1
    ends = t0[last] + dt[last]
    scale = np.maximum(np.abs(rec["end"]), np.abs(rec["end"] - rec["start"]))
    if not np.all(np.abs(ends - rec["end"]) <= TOLERANCE * scale + 1e-9):
        raise RuntimeError(
            "internal error: the iterations' breakdowns do not add up to the engine's times"
        )
    return t0


def _layout(rec: Any) -> tuple[Any, Any, Any, Any]:
    """Where each segment's logged numbers lie in its batch's counts: ``(offset, m, apart,
    growth)``, the first one's index, its ``m`` growth counts (repeating), whether its
    needed-block counts follow them (``apart``), and how many those two take (``growth``);
    the iterations its queue's arrivals join at come after them."""
    m = np.abs(rec["counts"])
    apart = rec["counts"] < 0
    growth = np.where(apart, 2 * m, m)
    width = growth + rec["joins"]
    return np.cumsum(width) - width, m, apart, growth


def _waiting(rec: Any, first: Any, seg: Any, counts: Any, layout: tuple, each: Any) -> Any:
    """Each iteration's waiting requests: its segment's first iteration's, plus those that
    joined the queue at the start of its iterations so far (logged after the counts)."""
    waiting = each("waiting")
    joins = rec["joins"]
    if not joins.any():
        return waiting
    offset, _m, _apart, growth = layout
    which = np.repeat(np.arange(len(rec)), joins)  # each join's segment
    nth = np.arange(len(which)) - (np.cumsum(joins) - joins)[which]  # its place in it
    at = counts[(offset + growth)[which] + nth]
    joined = np.zeros(len(seg) + 1, np.int64)
    np.add.at(joined, first[which] + at, 1)
    so_far = np.cumsum(joined[:-1])
    return waiting + so_far - (so_far - joined[:-1])[first][seg]


def _blocks(
    rec: Any, first: Any, seg: Any, j: Any, counts: Any, layout: tuple, capacity_blocks: int
) -> tuple[Any, Any]:
    """Each iteration's used and held blocks: its segment's, plus the growth of its steps so
    far (the logged counts, repeating)."""
    offset, m, apart, _growth = layout
    where = offset[seg] + j % m[seg]
    grow = counts[where]
    grown = np.cumsum(grow)
    if apart.any():
        need = counts[where + np.where(apart, m, 0)[seg]]
        needed = np.cumsum(need)
    else:
        need, needed = grow, grown
    used = (rec["used"] - (grown - grow)[first])[seg] + grown
    free = (rec["free"] + (needed - need)[first])[seg] - needed
    return used, capacity_blocks - free
