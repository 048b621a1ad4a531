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
are appended to an unlinked temporary file, which :meth:`IterationLog.timeline` reads back
in chunks once the makespan (the timeline's bucket width) is known: memory does not grow
with the number of iterations.
"""

from __future__ import annotations

import struct
import tempfile
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

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
FLUSH_BYTES = 16384 * SEGMENT.size
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
    else they go to a temporary file under ``spill_dir`` (None: the system's)."""

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
        self.spill: Any = None
        self.int_type = np.int32 if capacity_blocks < 2**31 - 1 else np.int64
        self.spilled_iterations = 0
        self.cost = cost  # a cost model: each iteration's cost arguments are kept too
        self.kept_args: list[tuple[np.ndarray, ...]] = []

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
        last one, so ``now`` is not where they end)."""
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
        args = None if self.cost is None else _cost_arguments(rec, running, context)
        if self.kept is not None:
            for target, values in zip(
                self.kept, (t0, dt, used, held, running, waiting), strict=True
            ):
                target.extend(values.tolist())
            if args is not None:
                self.kept_args.append(args)
            return
        if self.spill is None:
            self.spill = tempfile.TemporaryFile(prefix="cpkv-samples-", dir=self.spill_dir)
        ints = self.int_type
        np.array([len(dt)], dtype=np.int64).tofile(self.spill)
        for values, kind in ((t0, np.float64), (dt, np.float64), (used, ints), (held, ints),
                             (running, ints), (waiting, ints)):  # fmt: skip
            values.astype(kind, copy=False).tofile(self.spill)
        if args is not None:  # the decode context, then the full iterations' arguments
            args[2].tofile(self.spill)
            full = np.flatnonzero(rec[:, 0] == FULL)
            where = first[full].astype(np.int64)
            np.array([len(where)], dtype=np.int64).tofile(self.spill)
            where.tofile(self.spill)
            np.stack([a[where] for a in (args[0], args[1], args[3], args[4], args[5])]).tofile(
                self.spill
            )
        self.spilled_iterations += len(dt)

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
        runs = np.flatnonzero(rec[:, 9] != 0).tolist()
        if not runs or runs[0] != 0:
            runs.insert(0, 0)
        bounds = [*runs, len(rec)]
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

    def chunks(self, size: int = 1 << 18):
        """The samples in order, as arrays ``(t0, dt, used, held, running, waiting, args)`` of
        about ``size`` iterations each (from memory or from the temporary file); ``args``:
        the six arrays of the iterations' cost arguments (:func:`_cost_arguments`), None
        without a cost model."""
        with_args = self.cost is not None
        if self.kept is not None:
            if self.kept[0]:
                args = (
                    tuple(np.concatenate(a) for a in zip(*self.kept_args, strict=True))
                    if with_args
                    else None
                )
                yield (*(np.asarray(v) for v in self.kept), args)
            return
        if self.spill is None:
            return
        self.spill.seek(0)
        pieces: list[tuple[Any, ...]] = []
        held_count = 0
        ints = self.int_type
        read = self.spill
        while True:
            header = np.fromfile(read, dtype=np.int64, count=1)
            if not len(header):
                break
            n = int(header[0])
            piece: list[Any] = [
                np.fromfile(read, dtype=kind, count=n)
                for kind in (np.float64, np.float64, ints, ints, ints, ints)
            ]
            if with_args:
                decode_context = np.fromfile(read, dtype=np.int64, count=n)
                m = int(np.fromfile(read, dtype=np.int64, count=1)[0])
                where = np.fromfile(read, dtype=np.int64, count=m)
                full = np.fromfile(read, dtype=np.int64, count=5 * m).reshape(5, m)
                prefill, prefill_context = np.zeros(n, np.int64), np.zeros(n, np.int64)
                pairs, loaded = np.zeros(n, np.int64), np.zeros(n, np.int64)
                decode = piece[4].astype(np.int64)
                for target, values in zip(
                    (prefill, decode, prefill_context, pairs, loaded), full, strict=True
                ):
                    target[where] = values
                piece.append((prefill, decode, decode_context, prefill_context, pairs, loaded))
            else:
                piece.append(None)
            pieces.append(tuple(piece))
            held_count += n
            if held_count >= size:
                yield _joined(pieces)
                pieces, held_count = [], 0
        if pieces:
            yield _joined(pieces)

    def discard(self) -> None:
        """Close the temporary file (it was unlinked when created)."""
        if self.spill is not None:
            self.spill.close()
            self.spill = None


def _joined(pieces: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """Pieces of samples (the same columns each; the last a tuple of arrays or None) as one."""
    columns = list(zip(*pieces, strict=True))
    args = columns.pop()
    out: list[Any] = [np.concatenate(c) for c in columns]
    out.append(
        None if args[0] is None else tuple(np.concatenate(a) for a in zip(*args, strict=True))
    )
    return tuple(out)


def _cost_arguments(rec: np.ndarray, running: np.ndarray, context: np.ndarray) -> tuple:
    """The six ``batch_us`` arguments of each expanded iteration, as int64 arrays: a full
    iteration's as it logged them, a decode stretch's ``(0, running, context, 0, 0, 0)``."""
    steps = rec[:, 1].astype(np.int64)
    full = np.repeat(rec[:, 0] == FULL, steps)
    logged = [np.repeat(rec[:, 10 + j].astype(np.int64), steps) for j in range(6)]
    prefill, decode, decode_context, prefill_context, pairs, loaded = (
        np.where(full, x, 0) for x in logged
    )
    decode = np.where(full, decode, running)
    decode_context = np.where(full, decode_context, context)
    return prefill, decode, decode_context, prefill_context, pairs, loaded


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
