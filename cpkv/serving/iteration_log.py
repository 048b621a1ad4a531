"""The serving loop's per-iteration samples, logged compactly and expanded in batches.

Every iteration has a sample: its start and duration (µs), the KV blocks used and held after
its allocations, the requests running and waiting. A run of a million requests has tens of
millions of iterations, so the loop does not append six numbers per iteration: it logs one
fixed-width *segment* per full iteration and one per decode stretch with a constant running
set (:mod:`cpkv.serving.decode_stretch`), and :meth:`IterationLog.flush` expands a batch of
segments into per-iteration arrays with numpy:

* a stretch's durations are recomputed as the stretch computed them (``a + ctx * context``
  for the linear cost model, element for element the same float operations) or taken from
  the durations it logged (any other model);
* its used / held blocks from the growth of each step: the blocks that step needs come from
  the pool's per-phase counts, which the stretch logs for its first ``min(k, block_size)``
  steps (they repeat with the block size);
* start times by a sequential cumulative sum of the durations from the segment's start,
  restarted where the loop jumped over idle time. Each segment's logged start and the
  loop's final time are checked against the sums, so an expansion that would not give the
  loop's own times fails loudly instead of writing different numbers.

The expanded samples then feed the run's integrals (sum of used x duration and held x
duration in iteration order, exactly as ``sum()`` over the iterations adds them; peaks;
counts) and either stay in memory (``keep``: small runs and tests, ``SimResult.timeline``) or
go on with the run's cost model: each iteration's time breakdown is computed from its cost
arguments (a full iteration's as it logged them, a stretch's ``(0, running, context, 0, 0,
0)``) with the model's vectorised ``breakdowns``, its time checked against the duration,
summed over the run in iteration order (the summary's ``time``,
:class:`~cpkv.serving.cost.report.TimeTotals`), and the samples and breakdown columns are
appended, compactly, to an unlinked temporary file (:mod:`cpkv.serving.sample_spill`) which
:func:`~cpkv.serving.timeline.timeline_and_time` reads back once the makespan (the
timeline's bucket width) is known (:mod:`cpkv.serving.bucket_sums`): all the work that does
not need the makespan is done as the run goes (in the helper process of a long run), and
memory does not grow with the number of iterations.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

from cpkv.serving.cost.report import TimeTotals, breakdown_columns
from cpkv.serving.sample_spill import SampleSpill, constant_or_array

FULL, LINEAR, LOGGED, FORM, APART = 0, 1, 2, 3, 4
"""Segment kinds: one full iteration; a decode stretch with linear-model durations; a decode
stretch whose durations were logged; a decode stretch with durations of the cost model's
decode form (``((head + scale * (slope * context)) + tail) + last``: ``head`` in the
constant term's place, the other four in those of a full iteration's cost arguments); ``| APART``: the stretch logged its needed-block counts
apart from its used-block counts (a running request holds a reservation)."""
WIDTH = 16
"""Fields per segment (8 bytes each): kind, iterations, start, running, waiting, the duration's constant
term, the context the first step reads (each step reads ``running`` more), the blocks used
and free after the first step's allocations *less that step's growth*, whether the loop
jumped over idle time just before it, and, for a full iteration, the six arguments the
loop gave the cost model (prefill tokens, decoding requests, decode context, prefill
context, prefill attention pairs, loaded tokens; zeros in a stretch, whose iterations are
``(0, running, context, 0, 0, 0)``). A full iteration is a one-step segment whose constant
term is its duration, context 0, growth 0 (one logged count of 0): its used and free blocks
are its own."""
SEGMENT = struct.Struct("<qqdqqdqqqdqqqqqq")
"""One segment, packed (``records += SEGMENT.pack(...)``: the loop's cheapest append): the
start, the constant term and the jump flag as doubles, every other field an integer
(int64: packing an integer as a double costs twice as much)."""
SEGMENT_FORM = struct.Struct("<qqdqqdqqqdddddqq")
"""A ``FORM`` stretch: its four decode-form terms (fields 10-13) are doubles."""
FLOAT_FIELDS = [2, 5, 9]
FORM_FIELDS = [10, 11, 12, 13]
FLUSH_BYTES = 4096 * SEGMENT.size
"""Segments logged before a batch is expanded."""


@dataclass
class Integrals:
    """What the summary row needs of the samples (see :func:`cpkv.serving.metrics.summary_row`)."""

    iterations: int = 0
    used_block_us: float = 0.0  # sum of used x duration, in iteration order
    held_block_us: float = 0.0
    used_sum: int = 0  # plain sums (the mean per iteration when the makespan is 0)
    held_sum: int = 0
    used_peak: int = 0


class IterationLog:
    """Segments of one run; ``keep`` keeps every sample as lists (``SimResult.timeline``),
    else they are broken down by ``cost`` (the run's cost model) and go to a temporary file
    under ``spill_dir`` (None: the system's)."""

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int,
        keep: bool,
        spill_dir: Any = None,
        cost: Any = None,
    ) -> None:
        self.capacity_blocks, self.block_size = capacity_blocks, block_size
        self.records = bytearray()  # packed segments
        self.phase_counts = array("q")  # per stretch: m counts of used growth, m of needed
        self.durations = array("d")  # LOGGED stretches
        self.context_coef = 0.0  # LINEAR stretches: duration = a + context_coef * context
        self.jumped = 0.0
        self.forward: Any = None  # a helper process: the batches go to it
        self.totals = Integrals()
        self.kept: tuple[list, ...] | None = ([], [], [], [], [], []) if keep else None
        self.spill_dir = spill_dir
        self.spill: SampleSpill | None = None
        if not keep and cost is None:
            raise ValueError("spilled samples need the run's cost model (their breakdown)")
        self.cost = cost  # spilled samples: the iterations' breakdowns, from their arguments
        self.time_totals = TimeTotals()  # the breakdown summed over the run, in order

    # -- logging (the loop's side: it packs each segment, :data:`SEGMENT`, into ``records``
    # itself, the stretches' growth counts into ``phase_counts``, and calls ``flush`` when
    # ``records`` holds :data:`FLUSH_BYTES`) -----------------------------------------------
    def idle_jump(self) -> None:
        """The loop moved its clock over idle time: the next segment starts a new sum."""
        self.jumped = 1.0

    # -- expanding --------------------------------------------------------------------------
    def flush(self, now: float) -> None:
        """Expand the logged segments (``now``: the loop's time after the last one), or hand
        them to ``forward``."""
        if not self.records:
            return
        batch = (
            bytes(self.records), self.phase_counts.tobytes(), self.durations.tobytes(), now,
            bool(self.jumped),
        )  # fmt: skip
        self.records.clear()  # (the loop holds these three: empty them, keep them)
        del self.phase_counts[:], self.durations[:]
        if self.forward is not None:
            self.forward(*batch)
        else:
            self.process(*batch)

    def process(
        self, records: bytes, counts: bytes, durations: bytes, now: float, jumped: bool
    ) -> None:
        """Expand a batch of segments (``jumped``: the loop jumped over idle time after the
        last one, so ``now`` is not where they end): the integrals, then the samples kept,
        or broken down, the breakdown summed, and spilled (module docstring)."""
        rec = _segments(records)
        steps = rec[:, 1].astype(np.int64)
        first = np.cumsum(steps) - steps  # each segment's first iteration
        t0, dt, used, held, running, waiting, context = self._expand(
            rec,
            np.frombuffer(counts, dtype=np.int64),
            np.frombuffer(durations, dtype=np.float64),
            None if jumped else now,
        )
        totals = self.totals
        totals.iterations += len(dt)
        totals.used_block_us = _sequential_sum(totals.used_block_us, used * dt)
        totals.held_block_us = _sequential_sum(totals.held_block_us, held * dt)
        totals.used_sum += int(used.sum())
        totals.held_sum += int(held.sum())
        totals.used_peak = max(totals.used_peak, int(used.max()))
        if self.kept is not None:
            for target, values in zip(
                self.kept, (t0, dt, used, held, running, waiting), strict=True
            ):
                target.extend(values.tolist())
            return
        columns = breakdown_columns(self.cost, *_cost_arguments(rec, first, running, context))
        if not np.array_equal(np.broadcast_to(columns[0], dt.shape), dt):
            raise RuntimeError(
                "internal error: the cost model's breakdown does not give the loop's durations"
            )
        columns[1:] = [constant_or_array(c) for c in columns[1:]]
        if self.spill is None:
            self.spill = SampleSpill(self.spill_dir)
        runs = _run_heads(rec)
        starts = list(zip(first[runs].tolist(), rec[runs, 2].tolist(), strict=True))
        self.spill.append(dt, starts, t0, (used, held, running, waiting), columns[1:])
        self.time_totals.add(columns, len(dt))  # (after the spill: it sums them in place)

    def _expand(self, rec: np.ndarray, counts: np.ndarray, logged: np.ndarray, now: float | None):
        kind = rec[:, 0].astype(np.int64)
        steps = rec[:, 1].astype(np.int64)
        total = int(steps.sum())
        first = np.cumsum(steps) - steps  # each segment's first iteration
        j = np.arange(total) - np.repeat(first, steps)  # the step within its segment
        running = np.repeat(rec[:, 3].astype(np.int64), steps)
        waiting = np.repeat(rec[:, 4].astype(np.int64), steps)
        # durations: a full iteration's own (its context term is 0.0), a LINEAR stretch's
        # a + ctx * context, a LOGGED one's as logged
        context = np.repeat(rec[:, 6].astype(np.int64), steps) + running * j
        dt = np.repeat(rec[:, 5], steps) + self.context_coef * context
        if len(logged):
            dt[np.repeat((kind & 3) == LOGGED, steps)] = logged
        formed = np.repeat((kind & 3) == FORM, steps)
        if formed.any():  # element-wise, the loop's own operations in its order
            head, scale, slope, tail, last = (
                np.repeat(rec[:, j], steps)[formed] for j in (5, 10, 11, 12, 13)
            )
            dt[formed] = ((head + scale * (slope * context[formed])) + tail) + last
        # blocks: counts logged for min(k, block) steps (one 0 for a full iteration),
        # cycling; the needed counts after them when they differ
        m = np.where(kind == FULL, 1, np.minimum(steps, self.block_size))
        apart = (kind & APART) != 0
        width = np.where(apart, 2 * m, m)
        offset = np.cumsum(width) - width
        where = np.repeat(offset, steps) + j % np.repeat(m, steps)
        grow = counts[where]
        need = counts[where + np.repeat(np.where(apart, m, 0), steps)] if apart.any() else grow
        grown, needed = np.cumsum(grow), np.cumsum(need)
        used = np.repeat(rec[:, 7].astype(np.int64) - (grown - grow)[first], steps) + grown
        held = self.capacity_blocks - (
            np.repeat(rec[:, 8].astype(np.int64) + (needed - need)[first], steps) - needed
        )
        t0 = np.empty(total)
        bounds = [*_run_heads(rec).tolist(), len(rec)]
        end = 0.0
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            lo, hi = int(first[a]), int(first[b]) if b < len(rec) else total
            sums = np.empty(hi - lo + 1)
            sums[0] = rec[a, 2]
            sums[1:] = dt[lo:hi]
            np.cumsum(sums, out=sums)  # sequential: the loop's own additions
            t0[lo:hi] = sums[:-1]
            end = float(sums[-1])
        if not np.array_equal(t0[first], rec[:, 2]) or (now is not None and end != now):
            raise RuntimeError(
                "internal error: the iteration samples do not add up to the loop's own times"
            )
        return t0, dt, used, held, running, waiting, context

    # -- reading back -------------------------------------------------------------------------
    def close(self, now: float) -> Integrals:
        """Expand what is left; the run's integrals."""
        self.flush(now)
        return self.totals

    def chunks(self):
        """The samples in order, as arrays ``(t0, dt, used, held, running, waiting)``, a chunk
        at a time (from memory or from the temporary file)."""
        if self.kept is not None:
            if self.kept[0]:
                yield tuple(np.asarray(v) for v in self.kept)
            return
        if self.spill is None:
            return
        reader = self.spill.reader()
        for chunk in self.spill.chunks:
            got = reader.read(chunk)
            n = chunk.count
            counts = (
                np.full(n, c) if isinstance(c, int) else c.astype(np.int64) for c in got.counts
            )
            yield (got.t0.copy(), got.floats[0].copy(), *counts)

    def discard(self) -> None:
        """Close the temporary file (it was unlinked when created)."""
        if self.spill is not None:
            self.spill.close()
            self.spill = None


def _run_heads(rec: np.ndarray) -> np.ndarray:
    """The segments that start a run of back-to-back iterations: the first, and those after
    idle time."""
    heads = np.flatnonzero(rec[:, 9] != 0)
    return heads if len(heads) and heads[0] == 0 else np.concatenate(([0], heads))


def _cost_arguments(rec: np.ndarray, first: np.ndarray, running: np.ndarray, context: np.ndarray):
    """The six ``batch_us`` arguments of each expanded iteration, as int64 arrays: a full
    iteration's as it logged them, a decode stretch's ``(0, running, context, 0, 0, 0)``."""
    full = np.flatnonzero(rec[:, 0] == FULL)
    where = first[full]
    logged = rec[full, 10:16].astype(np.int64).T
    out = []
    for j, stretch in enumerate((None, running, context, None, None, None)):
        values = np.zeros(len(running), np.int64) if stretch is None else stretch.copy()
        values[where] = logged[j]
        out.append(values)
    return out


def _segments(records: bytes) -> np.ndarray:
    """Packed segments (:data:`SEGMENT`, :data:`SEGMENT_FORM`) as one ``(n, WIDTH)`` float
    array: the integer fields converted (exactly, below 2**53, as packing them as doubles
    did), the double fields as they are."""
    ints = np.frombuffer(records, dtype=np.int64).reshape(-1, WIDTH)
    floats = np.frombuffer(records, dtype=np.float64).reshape(-1, WIDTH)
    rec = ints.astype(np.float64)
    rec[:, FLOAT_FIELDS] = floats[:, FLOAT_FIELDS]
    form = np.flatnonzero((ints[:, 0] & 3) == FORM)
    if len(form):
        rec[np.ix_(form, FORM_FIELDS)] = floats[np.ix_(form, FORM_FIELDS)]
    return rec


def _sequential_sum(start: float, values: np.ndarray) -> float:
    """``start + values[0] + values[1] + ...``, added one by one in order (as ``sum()`` and
    a ``+=`` loop add floats), not pairwise as ``numpy.sum`` does."""
    if not len(values):
        return start
    sums = np.empty(len(values) + 1)
    sums[0] = start
    sums[1:] = values
    return float(np.cumsum(sums, out=sums)[-1])
