"""The iterations of a serving run, logged as segments and summed once the run has ended.

Every iteration has a sample: its start and duration (µs), the KV blocks used and held
after its allocations, the requests running and waiting, and its cost arguments (the six
numbers the cost model prices it from). A run of a million requests has tens of millions of
iterations, so the engine logs one fixed-width *segment* per full iteration
(:meth:`IterationLog.iteration`) and one per closed-form stretch
(:meth:`IterationLog.stretch`; the format and its expansion:
:mod:`cpkv.serving.record.segments`). Segments are packed as they come (the growth counts
beside them) and, a batch at a time, written to an unlinked temporary file (under
``spill_dir``) so that memory does not grow with the run; a run that keeps its samples
(``keep``: small runs, tests) holds its batches in memory. :meth:`IterationLog.summary`
reads the batches back once the makespan is known
(:func:`~cpkv.serving.record.segments.summary`).

Beside the segments, the log holds the requests' token gaps (``gaps``, a
:class:`~cpkv.serving.record.token_gaps.GapLog`, spilled and kept alike). A segment carries
its one-iteration gaps; the first read of the segments (:meth:`IterationLog.summary`, or
:meth:`IterationLog.settle_gaps`) turns them into the gap log's records, so that the engines
log no more than the segment for them. The engines log the other gaps into ``gaps``
themselves.
"""

from __future__ import annotations

from array import array
from typing import Any, Final

import numpy as np

from cpkv.serving.record.segments import SEGMENT, LogSummary, expand, segment_gaps, summary
from cpkv.serving.record.spill import Spill
from cpkv.serving.record.token_gaps import GapLog

FLUSH_SEGMENTS: Final = 8192
"""Segments held before a batch is written out."""
SEGMENT_BYTES: Final = SEGMENT.size


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
        self.records = bytearray(FLUSH_SEGMENTS * SEGMENT_BYTES)  # the batch's segments
        self.pack_into = SEGMENT.pack_into
        self.counts = array("q")
        self.segments = 0  # in ``records``
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
        self.pack_into(
            self.records, self.segments * SEGMENT_BYTES, 1, start, start + duration, running,
            waiting, decode, used, free, prefill, decode_context, prefill_context, pairs, 0,
            loaded, 1, 0, gaps, 0.0, 0.0,
        )  # fmt: skip
        self.counts.append(0)
        self.segments += 1
        if self.segments >= FLUSH_SEGMENTS:
            self.flush()

    def stretch(
        self, start: float, steps: int, end: float, running: int, waiting: int, used: int,
        free: int, prefill: int, decode_context: int, prefill_context: int, pairs: int,
        pairs_step: int, grow: list[int], need: list[int] | None, gaps: int = 0,
        gap_a: float = 0.0, gap_b: float = 0.0, joins: list[int] | None = None,
    ) -> None:  # fmt: skip
        """``steps`` iterations of a stretch (:mod:`cpkv.serving.engine.stretch`): the
        first's arguments (``waiting``: its queue); its blocks before its growth; ``grow``:
        the blocks each of the first ``len(grow)`` steps uses (repeating after), ``need``:
        the free blocks each needs when that differs; ``gaps`` one-iteration token gaps in
        each of its iterations, of durations ``gap_a + gap_b j``; ``joins``: for each
        request that joins the queue within it, the iteration (from 0) at whose start it
        joins."""
        m = len(grow)
        self.pack_into(
            self.records, self.segments * SEGMENT_BYTES, steps, start, end, running, waiting,
            running, used, free, prefill, decode_context, prefill_context, pairs, pairs_step, 0,
            m if need is None else -m, 0 if joins is None else len(joins), gaps, gap_a, gap_b,
        )  # fmt: skip
        self.counts.fromlist(grow)
        if need is not None:
            self.counts.fromlist(need)
        if joins is not None:
            self.counts.fromlist(joins)
        self.segments += 1
        if self.segments >= FLUSH_SEGMENTS:
            self.flush()

    def flush(self) -> None:
        """Write the segments logged so far out (or keep them)."""
        if not self.segments:
            return
        filled = memoryview(self.records)[: self.segments * SEGMENT_BYTES]
        self.spilled.append(filled.tobytes(), self.counts.tobytes())
        filled.release()
        del self.counts[:]
        self.segments = 0

    def close(self, now: float) -> None:
        """The run ended at ``now``: the last segments go out; a run that keeps its samples
        expands them (``kept``: starts, durations, used, held, running, waiting)."""
        self.flush()
        if self.keep:
            cap, cost = self.capacity_blocks, self.cost
            parts = [expand(*batch, cost, cap) for batch in self.spilled.batches]
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
        timeline of ``points`` buckets (:func:`~cpkv.serving.record.segments.summary`)."""
        gaps = None if self.gaps_settled else self.gaps
        out = summary(self.read(), self.cost, self.capacity_blocks, end_us, points, gaps)
        self.gaps_settled = True
        return out

    def settle_gaps(self) -> GapLog:
        """The token gaps, the segments' own among them (read now unless a summary did)."""
        if not self.gaps_settled:
            self.flush()
            first = 0
            for records, _ in self.read():
                first = segment_gaps(records, first, self.gaps)
            self.gaps_settled = True
        return self.gaps
