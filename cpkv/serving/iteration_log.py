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

import tempfile
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

FULL, LINEAR, LOGGED = 0, 1, 2
"""Segment kinds: one full iteration; a decode stretch with linear-model durations; a decode
stretch whose durations were logged."""
WIDTH = 10
"""Doubles per segment: kind, iterations, start, running, waiting, then (full) duration,
used, held or (stretch) the duration's constant term, context at the first step, used and
free blocks before it; last, whether the loop jumped over idle time just before it."""
FLUSH_SEGMENTS = 16384
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
        self, capacity_blocks: int, block_size: int, keep: bool, spill_dir: Any = None
    ) -> None:
        self.capacity_blocks, self.block_size = capacity_blocks, block_size
        self.records = array("d")
        self.phase_counts = array("q")  # per stretch: m counts of used growth, m of needed
        self.durations = array("d")  # LOGGED stretches
        self.context_coef = 0.0  # LINEAR stretches: duration = a + context_coef * context
        self.jumped = 0.0
        self.totals = Integrals()
        self.kept: tuple[list, ...] | None = ([], [], [], [], [], []) if keep else None
        self.spill_dir = spill_dir
        self.spill: Any = None
        self.int_type = np.int32 if capacity_blocks < 2**31 - 1 else np.int64
        self.spilled_iterations = 0

    # -- logging (the loop's side) ----------------------------------------------------------
    def full(
        self, start: float, duration: float, used: int, held: int, running: int, waiting: int
    ) -> None:
        """One full iteration."""
        self.records.extend(
            (FULL, 1, start, running, waiting, duration, used, held, 0, self.jumped)
        )
        self.jumped = 0.0
        if len(self.records) >= FLUSH_SEGMENTS * WIDTH:
            self.flush(start + duration)

    def stretch(
        self,
        kind: int,
        steps: int,
        start: float,
        running: int,
        a: float,
        context: int,
        used: int,
        free: int,
        grow: list[int],
        need: list[int],
        end: float,
    ) -> None:
        """``steps`` decode-only iterations of ``running`` requests from ``start`` to ``end``:
        ``a`` (LINEAR) the durations' constant term, ``context`` the context the first step
        reads (each step reads ``running`` more), ``used`` / ``free`` the blocks before it,
        ``grow`` / ``need`` the blocks used / taken from the free ones by each of the first
        ``min(steps, block_size)`` steps (the same counts repeat every ``block_size`` steps)."""
        self.records.extend(
            (kind, steps, start, running, 0, a, context, used, free, self.jumped)
        )
        self.jumped = 0.0
        self.phase_counts.extend(grow)
        self.phase_counts.extend(need)
        if len(self.records) >= FLUSH_SEGMENTS * WIDTH:
            self.flush(end)

    def idle_jump(self) -> None:
        """The loop moved its clock over idle time: the next segment starts a new sum."""
        self.jumped = 1.0

    # -- expanding --------------------------------------------------------------------------
    def flush(self, now: float) -> None:
        """Expand the logged segments (``now``: the loop's time after the last one)."""
        if not self.records:
            return
        rec = np.frombuffer(self.records, dtype=np.float64).reshape(-1, WIDTH).copy()
        counts = np.frombuffer(self.phase_counts, dtype=np.int64).copy()
        logged = np.frombuffer(self.durations, dtype=np.float64).copy()
        del self.records[:], self.phase_counts[:], self.durations[:]
        t0, dt, used, held, running, waiting = self._expand(rec, counts, logged, now)
        totals = self.totals
        totals.iterations += len(dt)
        totals.used_block_us = _sequential_sum(totals.used_block_us, used * dt)
        totals.held_block_us = _sequential_sum(totals.held_block_us, held * dt)
        totals.used_sum += int(used.sum())
        totals.held_sum += int(held.sum())
        totals.used_peak = max(totals.used_peak, int(used.max()))
        if self.kept is not None:
            for target, values in zip(self.kept, (t0, dt, used, held, running, waiting), strict=True):
                target.extend(values.tolist())
            return
        if self.spill is None:
            self.spill = tempfile.TemporaryFile(prefix="cpkv-samples-", dir=self.spill_dir)
        ints = self.int_type
        np.array([len(dt)], dtype=np.int64).tofile(self.spill)
        for values, kind in ((t0, np.float64), (dt, np.float64), (used, ints), (held, ints),
                             (running, ints), (waiting, ints)):  # fmt: skip
            values.astype(kind, copy=False).tofile(self.spill)
        self.spilled_iterations += len(dt)

    def _expand(self, rec: np.ndarray, counts: np.ndarray, logged: np.ndarray, now: float):
        kind = rec[:, 0].astype(np.int64)
        steps = rec[:, 1].astype(np.int64)
        total = int(steps.sum())
        seg = np.repeat(np.arange(len(rec)), steps)
        first = np.cumsum(steps) - steps  # each segment's first iteration
        j = np.arange(total) - first[seg]  # the step within its segment
        running = rec[seg, 3].astype(np.int64)
        waiting = rec[seg, 4].astype(np.int64)
        dt = np.empty(total)
        used = np.empty(total, dtype=np.int64)
        held = np.empty(total, dtype=np.int64)
        full = kind == FULL
        at = first[full]
        dt[at] = rec[full, 5]
        used[at] = rec[full, 6].astype(np.int64)
        held[at] = rec[full, 7].astype(np.int64)
        stretch = ~full
        if stretch.any():
            self._expand_stretches(rec, counts, logged, kind, seg, j, stretch, dt, used, held)
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
        if not np.array_equal(t0[first], rec[:, 2]) or (end != now and not self.jumped):
            raise RuntimeError(
                "internal error: the iteration samples do not add up to the loop's own times"
            )
        return t0, dt, used, held, running, waiting

    def _expand_stretches(self, rec, counts, logged, kind, seg, j, stretch, dt, used, held):
        block = self.block_size
        steps = rec[:, 1].astype(np.int64)
        in_stretch = stretch[seg]
        sseg, sj = seg[in_stretch], j[in_stretch]
        # durations
        linear = kind[sseg] == LINEAR
        context = rec[sseg, 6].astype(np.int64) + rec[sseg, 3].astype(np.int64) * sj
        sdt = np.empty(len(sseg))
        sdt[linear] = rec[sseg[linear], 5] + self.context_coef * context[linear]
        sdt[~linear] = logged
        dt[in_stretch] = sdt
        # blocks: the per-phase growth counts logged for min(k, block) steps, cycling
        m = np.minimum(steps[stretch], block)
        offset = np.cumsum(2 * m) - 2 * m
        ordinal = (np.cumsum(stretch) - 1)[sseg]
        where = offset[ordinal] + sj % m[ordinal]
        grow, need = counts[where], counts[where + m[ordinal]]
        grow_sum, need_sum = np.cumsum(grow), np.cumsum(need)
        starts = sj == 0
        grow_before = np.repeat((grow_sum - grow)[starts], steps[stretch])
        need_before = np.repeat((need_sum - need)[starts], steps[stretch])
        used[in_stretch] = rec[sseg, 7].astype(np.int64) + grow_sum - grow_before
        free = rec[sseg, 8].astype(np.int64) - (need_sum - need_before)
        held[in_stretch] = self.capacity_blocks - free

    # -- reading back -------------------------------------------------------------------------
    def close(self, now: float) -> Integrals:
        """Expand what is left; the run's integrals."""
        self.flush(now)
        return self.totals

    def chunks(self, size: int = 1 << 18):
        """The samples in order, as arrays ``(t0, dt, used, held, running, waiting)`` of about
        ``size`` iterations each (from memory or from the temporary file)."""
        if self.kept is not None:
            if self.kept[0]:
                yield tuple(np.asarray(v) for v in self.kept)
            return
        if self.spill is None:
            return
        self.spill.seek(0)
        parts: list[tuple[np.ndarray, ...]] = []
        held_count = 0
        ints = self.int_type
        while True:
            header = np.fromfile(self.spill, dtype=np.int64, count=1)
            if not len(header):
                break
            n = int(header[0])
            part = tuple(
                np.fromfile(self.spill, dtype=kind, count=n)
                for kind in (np.float64, np.float64, ints, ints, ints, ints)
            )
            parts.append(part)
            held_count += n
            if held_count >= size:
                yield tuple(np.concatenate(p) for p in zip(*parts, strict=True))
                parts, held_count = [], 0
        if parts:
            yield tuple(np.concatenate(p) for p in zip(*parts, strict=True))

    def discard(self) -> None:
        """Close the temporary file (it was unlinked when created)."""
        if self.spill is not None:
            self.spill.close()
            self.spill = None


def _sequential_sum(start: float, values: np.ndarray) -> float:
    """``start + values[0] + values[1] + ...``, added one by one in order (as ``sum()`` and
    a ``+=`` loop add floats), not pairwise as ``numpy.sum`` does."""
    if not len(values):
        return start
    sums = np.empty(len(values) + 1)
    sums[0] = start
    sums[1:] = values
    return float(np.cumsum(sums, out=sums)[-1])
