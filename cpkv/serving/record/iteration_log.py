"""The iterations of a serving run, logged as segments and summed once the run has ended.

Every iteration has a sample: its start and duration (µs), the KV blocks used and held
after its allocations, the requests running and waiting, and its cost arguments (the six
numbers the cost model prices it from). A run of a million requests has tens of millions of
iterations, so the engine logs one fixed-width *segment* per full iteration
(:meth:`IterationLog.iteration`) and one per closed-form stretch
(:meth:`IterationLog.stretch`: ``steps`` iterations whose decode context, prefill context
and attention pairs grow by constant steps, whose blocks grow by counts that repeat with the
block size). Segments are packed as they come (:data:`SEGMENT`, the growth counts beside
them) and, a batch at a time, written to an unlinked temporary file (under ``spill_dir``)
so that memory does not grow with the run; a run that keeps its samples (``keep``: small
runs, tests) holds its batches in memory.

:meth:`IterationLog.summary` reads the batches back once the makespan is known and, batch
by batch, expands each segment into its iterations with numpy: their cost arguments, their
time breakdowns (the cost model's vectorised ``breakdowns``,
:func:`~cpkv.serving.cost.report.breakdown_columns`: the durations are the breakdowns'
times), their starts (each segment's logged start plus the durations before them in it),
their blocks. Each segment's end is checked against its logged end (within rounding): an
expansion that does not give the engine's own times fails loudly instead of writing other
numbers. From the iterations it sums, in one pass, what the run reports: the integrals
(used and held blocks x time, peaks; :class:`Integrals`), the time breakdown over the run
(:class:`~cpkv.serving.cost.report.TimeTotals`) and the timeline's buckets
(:class:`~cpkv.serving.record.timeline.TimelineSums`).

Beside the segments, the log holds the requests' token gaps (``gaps``, a
:class:`~cpkv.serving.record.token_gaps.GapLog`, spilled and kept alike). A segment carries
its one-iteration gaps (``gaps``: the requests that got a token at the end of each of its
iterations after one at the end of the iteration before; a full iteration's gap is its
duration, ``end - start``, a stretch's are the line ``gap_a + gap_b j``); the first read of
the segments (:meth:`IterationLog.summary`, or :meth:`IterationLog.settle_gaps`) turns them
into the gap log's records, so that the engines log no more than the segment for them.
The engines log the other gaps into ``gaps`` themselves.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

from cpkv.serving.cost.report import TimeTotals, breakdown_columns
from cpkv.serving.record.spill import Spill
from cpkv.serving.record.timeline import TimelineSums
from cpkv.serving.record.token_gaps import GapLog, Gaps

SEGMENT = struct.Struct("<qddqqqqqqqqqqqqqdd")
"""One segment: steps, start, end (µs), running, waiting, decode requests, used and free
blocks (after a full iteration's allocations; before a stretch's first step's growth),
prefill tokens, decode context, prefill context, attention pairs, the pairs' step, loaded
tokens, the number of growth counts logged for it (whose needed-block counts follow
them when negative), its one-iteration token gaps per iteration and, for a stretch, their
line's two numbers."""
SEGMENT_DTYPE = np.dtype(
    [
        ("steps", "<i8"), ("start", "<f8"), ("end", "<f8"), ("running", "<i8"),
        ("waiting", "<i8"), ("decode", "<i8"), ("used", "<i8"), ("free", "<i8"),
        ("prefill", "<i8"), ("decode_context", "<i8"), ("prefill_context", "<i8"),
        ("pairs", "<i8"), ("pairs_step", "<i8"), ("loaded", "<i8"), ("counts", "<i8"),
        ("gaps", "<i8"), ("gap_a", "<f8"), ("gap_b", "<f8"),
    ]
)  # fmt: skip
assert SEGMENT_DTYPE.itemsize == SEGMENT.size
FLUSH_SEGMENTS = 8192
"""Segments held before a batch is written out."""
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


class IterationLog:
    """The segments of one run (module docstring): ``capacity_blocks`` to turn free blocks
    into held ones, ``cost`` (the run's cost model) to break the iterations down."""

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int,
        keep: bool = False,
        spill_dir: Any = None,
        cost: Any = None,
    ) -> None:
        self.capacity_blocks, self.block_size, self.cost = capacity_blocks, block_size, cost
        self.records = bytearray()
        self.counts = array("q")
        self.segments = 0
        self.keep = keep
        self.spilled = Spill(keep, spill_dir, "cpkv-iterations-")  # (segments, counts) each
        self.kept: tuple[list, ...] | None = None
        self.gaps = GapLog(keep, spill_dir)
        self.gaps_settled = False  # the segments' gaps are in ``gaps``

    # -- logging ---------------------------------------------------------------------------
    def iteration(
        self, start: float, duration: float, running: int, waiting: int, used: int, free: int,
        prefill: int, decode: int, decode_context: int, prefill_context: int, pairs: int,
        loaded: int, gaps: int = 0,
    ) -> None:  # fmt: skip
        """One full iteration (its blocks after its allocations) and its one-iteration token
        gaps."""
        self.records += SEGMENT.pack(
            1, start, start + duration, running, waiting, decode, used, free, prefill,
            decode_context, prefill_context, pairs, 0, loaded, 1, gaps, 0.0, 0.0,
        )  # fmt: skip
        self.counts.append(0)
        self.segments += 1
        if self.segments >= FLUSH_SEGMENTS:
            self.flush()

    def stretch(
        self, start: float, steps: int, end: float, running: int, waiting: int, used: int,
        free: int, prefill: int, decode_context: int, prefill_context: int, pairs: int,
        pairs_step: int, grow: list[int], need: list[int] | None, gaps: int = 0,
        gap_a: float = 0.0, gap_b: float = 0.0,
    ) -> None:  # fmt: skip
        """``steps`` iterations of a stretch (:mod:`cpkv.serving.engine.stretch`): the
        first's arguments; its blocks before its growth; ``grow``: the blocks each of the
        first ``len(grow)`` steps uses (repeating after), ``need``: the free blocks each
        needs when that differs; ``gaps`` one-iteration token gaps in each of its
        iterations, of durations ``gap_a + gap_b j``."""
        m = len(grow)
        self.records += SEGMENT.pack(
            steps, start, end, running, waiting, running, used, free, prefill,
            decode_context, prefill_context, pairs, pairs_step, 0, m if need is None else -m,
            gaps, gap_a, gap_b,
        )  # fmt: skip
        self.counts.fromlist(grow)
        if need is not None:
            self.counts.fromlist(need)
        self.segments += 1
        if self.segments >= FLUSH_SEGMENTS:
            self.flush()

    def flush(self) -> None:
        """Write the segments logged so far out (or keep them)."""
        if not self.segments:
            return
        self.spilled.append(bytes(self.records), self.counts.tobytes())
        self.records.clear()
        del self.counts[:]
        self.segments = 0

    def close(self, now: float) -> None:
        """The run ended at ``now``: the last segments go out; a run that keeps its samples
        expands them (``kept``: starts, durations, used, held, running, waiting)."""
        self.flush()
        if self.keep:
            parts = [self.expand(*batch) for batch in self.spilled.batches]
            self.kept = tuple(
                np.concatenate([p[k] for p in parts]).tolist() if parts else [] for k in range(6)
            )

    def discard(self) -> None:
        """Close the temporary files (they were unlinked when created)."""
        self.spilled.discard()
        self.gaps.discard()

    # -- reading back ----------------------------------------------------------------------
    def read(self):
        """The batches in order, as ``(segment bytes, count bytes)``."""
        yield from self.spilled

    def summary(self, end_us: float, points: int) -> LogSummary:
        """Everything the run reports of its iterations, over a makespan of ``end_us`` and a
        timeline of ``points`` buckets (module docstring)."""
        totals, time = Integrals(), TimeTotals()
        timeline = TimelineSums(end_us, points) if end_us > 0 else None
        settle, first = not self.gaps_settled, 0
        for records, counts in self.read():
            if settle:
                first = self._segment_gaps(records, first)
            t0, dt, used, held, running, waiting, columns = self.expand(records, counts, True)
            totals.iterations += len(dt)
            # (no BLAS dot: numpy's BLAS threads spin for a while after a call, taking a core)
            totals.used_block_us += float((used * dt).sum())
            totals.held_block_us += float((held * dt).sum())
            totals.used_sum += int(used.sum())
            totals.held_sum += int(held.sum())
            totals.used_peak = max(totals.used_peak, int(used.max()))
            if timeline is not None:
                timeline.add(t0, dt, (used, held, running, waiting), columns)
            time.add(columns, len(dt))  # (last: it sums the columns in place)
        self.gaps_settled = True
        return LogSummary(totals, time, timeline)

    def settle_gaps(self) -> GapLog:
        """The token gaps, the segments' own among them (read now unless a summary did)."""
        if not self.gaps_settled:
            self.flush()
            first = 0
            for records, _ in self.read():
                first = self._segment_gaps(records, first)
            self.gaps_settled = True
        return self.gaps

    def _segment_gaps(self, records: bytes, first: int) -> int:
        """A batch's segments' gaps into the gap log (``first``: the iteration its first
        segment starts at); the iteration after the batch."""
        rec = np.frombuffer(records, dtype=SEGMENT_DTYPE)
        steps = rec["steps"]
        starts = first + np.cumsum(steps) - steps
        some = rec["gaps"] != 0
        if some.any():
            rec, full = rec[some], steps[some] == 1
            self.gaps.add(Gaps(
                starts[some], np.where(full, rec["end"] - rec["start"], rec["gap_a"]),
                np.where(full, 0.0, rec["gap_b"]), rec["steps"], rec["gaps"].astype(float),
            ))  # fmt: skip
        return first + int(steps.sum())

    def expand(self, records: bytes, counts: bytes, breakdown: bool = False):
        """A batch's iterations: ``(t0, dt, used, held, running, waiting)`` arrays, and the
        breakdown columns when asked."""
        rec = np.frombuffer(records, dtype=SEGMENT_DTYPE)
        steps = rec["steps"]
        first = np.cumsum(steps) - steps
        j = np.arange(int(steps.sum())) - np.repeat(first, steps)

        def each(name: str) -> Any:
            return np.repeat(rec[name], steps)

        prefill, decode = each("prefill"), each("decode")
        arguments = (
            prefill, decode, each("decode_context") + decode * j,
            each("prefill_context") + prefill * j, each("pairs") + each("pairs_step") * j,
            each("loaded"),
        )  # fmt: skip
        columns = breakdown_columns(self.cost, *arguments)
        dt = np.broadcast_to(columns[0], j.shape).astype(float)
        t0 = self._starts(rec, first, steps, dt)
        used, held = self._blocks(rec, first, steps, j, np.frombuffer(counts, dtype=np.int64))
        out = (t0, dt, used, held, each("running"), each("waiting"))
        return (*out, columns) if breakdown else out

    def _starts(self, rec: Any, first: Any, steps: Any, dt: Any) -> Any:
        """Each iteration's start: its segment's logged start plus the durations before it
        in the segment; each segment's end checked against the logged one."""
        before = np.cumsum(dt) - dt  # the durations before each iteration, in the batch
        offset = rec["start"] - before[first]
        t0 = np.repeat(offset, steps) + before
        last = first + steps - 1
        ends = t0[last] + dt[last]
        scale = np.maximum(np.abs(rec["end"]), np.abs(rec["end"] - rec["start"]))
        if not np.all(np.abs(ends - rec["end"]) <= TOLERANCE * scale + 1e-9):
            raise RuntimeError(
                "internal error: the iterations' breakdowns do not add up to the engine's times"
            )
        return t0

    def _blocks(self, rec: Any, first: Any, steps: Any, j: Any, counts: Any) -> tuple[Any, Any]:
        """Each iteration's used and held blocks: its segment's, plus the growth of its steps
        so far (the logged counts, repeating)."""
        m = np.abs(rec["counts"])
        apart = rec["counts"] < 0
        width = np.where(apart, 2 * m, m)
        offset = np.cumsum(width) - width
        where = np.repeat(offset, steps) + j % np.repeat(m, steps)
        grow = counts[where]
        need = counts[where + np.repeat(np.where(apart, m, 0), steps)] if apart.any() else grow
        grown, needed = np.cumsum(grow), np.cumsum(need)
        used = np.repeat(rec["used"] - (grown - grow)[first], steps) + grown
        free = np.repeat(rec["free"] + (needed - need)[first], steps) - needed
        return used, self.capacity_blocks - free
