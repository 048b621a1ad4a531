"""The per-bucket sums of a long serving run's ``timeline.jsonl``, from its spilled samples
(:mod:`cpkv.serving.sample_spill`), once the makespan, hence the bucket width, is known: the
only output work left at the end of the run (the integrals and the summary's ``time`` were
summed as the run went).

The numbers are those of the loops that define them, float for float:

* KV (:mod:`cpkv.serving.timeline`): bucket ``k`` adds, one by one, the pieces of earlier
  iterations that run on into it (in iteration order), then its own iterations' ``value x
  part`` (the whole duration, or up to the edge for one that runs on), for used, held,
  running and waiting; its peak is the highest used count of those;
* time breakdown (:mod:`cpkv.serving.cost.report`): bucket ``k`` adds the rows of its
  iterations that stop inside it (or start in the last bucket), one by one in iteration
  order, then the pieces of those that cross an edge, split by time
  (:func:`~cpkv.serving.cost.report.add_crossing`).

A chunk is read once; each of its buckets' runs of iterations is summed in place with one
``np.cumsum`` over a ``(columns, iterations)`` block (sequential, never pairwise), the
bucket's sum so far added to the run's first element: ``((s + x0) + x1) + ...``. Columns
that are one float in a chunk are not stored: ``0.0`` adds nothing; a part equal in every
iteration of the run (the overhead) is summed at the end, once per bucket, from the number
of its whole iterations (the sequential sums of that float, computed once).

Buckets are independent but for the iterations that cross an edge, so the work splits:
:class:`BucketSums` sums the buckets ``lo..hi-1`` only, reading the chunks from the first
that reaches bucket ``lo`` (the iterations crossing into it from earlier buckets give their
pieces, pending there, as in the whole pass) to the last that starts before ``hi``. In a
long run's helper process (:mod:`cpkv.serving.helper`; at least
:data:`SPLIT_MIN_ITERATIONS` iterations, Linux, more than one core) the buckets are cut into
:data:`RANGES` ranges of about as many iterations, and two processes take them one at a
time until none is left (a pipe holds a byte per range): a forked one, from the start, and
the helper, once it has summed the requests (the latency series' sorts), so both end
together whatever the share of each. The forked process reads the file on its own
(``preadv``) and sends its ranges' sums back pickled through a pipe (threads would not do:
too much of the pass holds the interpreter lock). The ranges are joined in bucket order:
the KV sums and whole-row sums by bucket, the crossing iterations in iteration order (each
counted by the range holding its first bucket).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cpkv.serving.cost.report import FIELDS, add_crossing
from cpkv.serving.timeline import bucket_pieces, bucket_starts

SPLIT_MIN_ITERATIONS = 1_000_000
"""Runs with fewer iterations are summed in one pass."""
RANGES = 16
"""Ranges of buckets a long run's sums are cut into, to be taken by two processes (at most
255: a range is one byte in a pipe)."""


@dataclass
class BucketPart:
    """The sums of buckets ``lo..hi-1``: KV (``(points, 4)``, zero outside), peaks, whole-row
    breakdown sums (``(points, 8)``), whole iterations per bucket, and the crossing
    iterations ``(index, first bucket, start, row)`` whose first bucket is in the range."""

    lo: int
    hi: int
    kv: Any
    peak: list[int]
    parts: Any
    whole: Any
    crossing: list[tuple[int, int, float, list[float]]] = field(default_factory=list)


class BucketSums:
    """The buckets ``lo..hi-1`` of a run whose makespan is ``end_us`` (> 0), fed its chunks in
    order (:meth:`add`); ``deferred``: the breakdown columns equal in every iteration of the
    run (summed by :func:`join` from the whole iterations' counts)."""

    def __init__(
        self, end_us: float, points: int, lo: int, hi: int, deferred: frozenset[int] = frozenset()
    ) -> None:
        self.width = end_us / points
        self.points, self.last = points, points - 1
        self.lo, self.hi = lo, hi
        self.deferred = deferred
        self.part = BucketPart(
            lo, hi, np.zeros((points, 4)), [0] * points, np.zeros((points, FIELDS)),
            np.zeros(points, dtype=np.int64),
        )  # fmt: skip
        self.pending: dict[int, list[tuple[float, float, float, float, int]]] = {}
        self.flushed = lo - 1  # buckets up to here have taken their pending pieces

    def bucket(self, t0: float) -> int:
        k = int(t0 / self.width)
        return k if k < self.last else self.last

    def add(self, index: int, chunk: Any) -> bool:
        """The next chunk (:class:`~cpkv.serving.sample_spill.ReadChunk`; its float columns
        are summed in place), its first iteration's ``index``. False once the chunk starts
        past the range (no later one matters)."""
        t0, stop, floats, counts = chunk.t0, chunk.stop, chunk.floats, chunk.counts
        n = len(t0)
        if not n:
            return True
        width, last, bucket = self.width, self.last, self.bucket
        lo, hi = self.lo, self.hi
        first, final = bucket(float(t0[0])), bucket(float(t0[-1]))
        if first >= hi:
            return False
        bounds = bucket_starts(t0, first, final, bucket, width)
        top = min(final, hi - 1)
        runs = []  # (bucket, first iteration, first crossing one, end)
        for k in range(first, top + 1):
            a, b = bounds[k - first], bounds[k - first + 1]
            if k < last and a < b:
                edge = (k + 1) * width
                c = a + int(np.searchsorted(stop[a:b], edge, side="right"))  # stop <= edge
            else:
                c = b
            runs.append((k, a, c, b))
        # the values x time of the buckets in range: the whole durations, up to the edge for
        # the iterations that run on; a count of 0 in every iteration adds nothing
        start = bounds[max(first, lo) - first] if top >= lo else 0
        end = bounds[top - first + 1] if top >= lo else 0
        part = stop[start:end] - t0[start:end]
        for k, _a, c, b in runs:
            if k >= lo and c < b:
                part[c - start : b - start] = (k + 1) * width - t0[c:b]
        series = [s for s, v in enumerate(counts) if not isinstance(v, int) or v]
        values = np.empty((len(series), end - start))
        for r, s in enumerate(series):
            v = counts[s]
            np.multiply(v if isinstance(v, int) else v[start:end], part, out=values[r])
        used = counts[0]
        sums = self.part
        for k, a, c, b in runs:
            if k >= lo:
                self._take_pending(k)
                if a == b:
                    continue
                block = values[:, a - start : b - start]
                block[:, 0] += sums.kv[k, series]
                sums.kv[k, series] = np.cumsum(block, axis=1, out=block)[:, -1]
                peak = used if isinstance(used, int) else int(used[a:b].max())
                if peak > sums.peak[k]:
                    sums.peak[k] = peak
                if c > a:
                    self._add_whole(k, floats[:, a:c], chunk.stored, chunk.constants)
            for i in range(c, b):  # they run on: their row, and their later pieces
                at, stops = float(t0[i]), float(stop[i])
                if k >= lo:
                    row = [chunk.constants.get(j, 0.0) for j in range(FIELDS)]
                    for r, j in enumerate(chunk.stored):
                        row[j] = float(floats[r, i])
                    sums.crossing.append((index + i, k, at, row))
                kv = [v if isinstance(v, int) else int(v[i]) for v in counts]
                for kk, piece in bucket_pieces(at, stops, k, width, last, *kv)[1:]:
                    if lo <= kk < hi:
                        self.pending.setdefault(kk, []).append(piece)
        return top == final  # the chunk's last bucket is in range: later ones may be too

    def _add_whole(
        self, k: int, block: Any, stored: list[int], constants: dict[int, float]
    ) -> None:
        """The whole iterations of bucket ``k`` in this chunk: their stored columns summed in
        place, their constant ones added one by one (``0.0`` and deferred ones skipped)."""
        sums = self.part
        block[:, 0] += sums.parts[k, stored]
        sums.parts[k, stored] = np.cumsum(block, axis=1, out=block)[:, -1]
        m = block.shape[1]
        for j, value in constants.items():
            if value == 0.0 or j in self.deferred:
                continue
            ones = np.full(m, value)
            ones[0] += sums.parts[k, j]
            sums.parts[k, j] = np.cumsum(ones, out=ones)[-1]
        sums.whole[k] += m

    def _take_pending(self, upto: int) -> None:
        """Buckets up to ``upto`` add the pieces pending for them (before their own)."""
        sums = self.part
        for k in range(self.flushed + 1, upto + 1):
            pieces = self.pending.pop(k, None)
            if pieces:
                columns = np.array([p[:4] for p in pieces])
                for s in range(4):
                    line = np.empty(len(pieces) + 1)
                    line[0] = sums.kv[k, s]
                    line[1:] = columns[:, s]
                    sums.kv[k, s] = np.cumsum(line, out=line)[-1]
                peak = max(p[4] for p in pieces)
                if peak > sums.peak[k]:
                    sums.peak[k] = peak
        self.flushed = max(self.flushed, upto)

    def finish(self) -> BucketPart:
        """The range's sums (pending pieces taken)."""
        self._take_pending(self.hi - 1)
        return self.part


def join(
    ranges: list[BucketPart], end_us: float, points: int, deferred: dict[int, float]
) -> tuple[Any, list[int], Any]:
    """The whole run's ``(kv sums, peaks, breakdown sums)`` from the sums of consecutive
    bucket ranges (in order): the deferred columns summed from the whole iterations' counts,
    then the crossing iterations' pieces added, in iteration order."""
    kv = np.zeros((points, 4))
    peak = [0] * points
    parts = np.zeros((points, FIELDS))
    whole = np.zeros(points, dtype=np.int64)
    crossing: list[tuple[int, float, list[float]]] = []
    for part in ranges:
        lo, hi = part.lo, part.hi
        kv[lo:hi] = part.kv[lo:hi]
        peak[lo:hi] = part.peak[lo:hi]
        parts[lo:hi] = part.parts[lo:hi]
        whole[lo:hi] = part.whole[lo:hi]
        crossing += [(k, t, row) for _, k, t, row in part.crossing]
    most = int(whole.max()) if points else 0
    for j, value in deferred.items():
        if value == 0.0 or not most:
            continue
        sums = np.cumsum(np.full(most, value))  # the sums of 1, 2, ... of them, one by one
        parts[:, j] = np.where(whole > 0, sums[np.maximum(whole - 1, 0)], 0.0)
    add_crossing(parts, crossing, end_us / points, points)
    return kv, peak, parts


class SpilledBucketSums:
    """The per-bucket sums of a run whose makespan is ``end_us`` (> 0) from its
    :class:`~cpkv.serving.sample_spill.SampleSpill`. With ``fork`` (and a long run), the
    buckets are cut into :data:`RANGES` ranges of about as many iterations each, and a
    forked process starts now taking ranges one by one and summing them; :meth:`result`
    does the same here with the ranges left (do other work first: the forked process goes
    on), then joins them all (module docstring)."""

    def __init__(self, spill: Any, end_us: float, points: int, fork: bool = False) -> None:
        self.spill, self.end_us, self.points = spill, end_us, points
        self.deferred = spill.constant_parts()
        cuts = _range_cuts(spill, end_us, points) if fork and _can_fork() else []
        self.ranges = list(zip([0, *cuts], [*cuts, points], strict=True))
        self.tokens = -1  # a pipe holding one byte per range not taken yet
        self.other: Any = None
        if len(self.ranges) > 1:
            self.tokens, write = os.pipe()
            try:
                os.write(write, bytes(range(len(self.ranges))))
            finally:
                os.close(write)
            self.other = forked(self._take_ranges)

    def result(self) -> tuple[Any, list[int], Any]:
        """``(kv sums, peaks, breakdown sums)`` per bucket."""
        spill, end_us, points = self.spill, self.end_us, self.points
        if self.other is None:
            parts = [
                _sum_range(spill.reader(), spill.chunks, end_us, points, 0, points, self.deferred)
            ]
        else:
            try:
                try:
                    parts = self._take_ranges()
                finally:
                    theirs = self.other()  # (waited for in any case)
            finally:
                os.close(self.tokens)
            parts = sorted([*parts, *theirs], key=lambda part: part.lo)
        return join(parts, end_us, points, self.deferred)

    def _take_ranges(self) -> list[BucketPart]:
        """Take ranges until none is left (a read of one byte from the pipe is atomic: each
        range is taken once, here or in the other process), and sum them."""
        spill, end_us, points = self.spill, self.end_us, self.points
        width, chunks = end_us / points, spill.chunks
        reader = spill.reader()
        parts = []
        while token := os.read(self.tokens, 1):
            lo, hi = self.ranges[token[0]]
            edge = lo * width  # the range's first pieces start here
            first = next(
                i for i, c in enumerate(chunks)
                if c.last_stop_us > edge or min(int(c.last_start_us / width), points - 1) >= lo
            )  # fmt: skip
            parts.append(_sum_range(reader, chunks[first:], end_us, points, lo, hi, self.deferred))
        return parts


def spilled_bucket_sums(
    spill: Any, end_us: float, points: int, fork: bool = False
) -> tuple[Any, list[int], Any]:
    """``(kv sums, peaks, breakdown sums)`` per bucket (:class:`SpilledBucketSums`)."""
    return SpilledBucketSums(spill, end_us, points, fork).result()


def forked(work: Any) -> Any:
    """Run ``work()`` in a forked process; the function returned waits for its result
    (pickled back through a pipe) or raises its error as a ``RuntimeError``."""
    read, write = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read)
            try:
                data = pickle.dumps((True, work()), protocol=pickle.HIGHEST_PROTOCOL)
                code = 0
            except BaseException as err:  # noqa: BLE001 - said to the parent
                data = pickle.dumps((False, f"{type(err).__name__}: {err}"))
            view = memoryview(data)
            while view:
                view = view[os.write(write, view) :]
        finally:
            os._exit(code)
    os.close(write)

    def wait() -> Any:
        parts = []
        try:
            while chunk := os.read(read, 1 << 20):
                parts.append(chunk)
        finally:
            os.close(read)
            os.waitpid(pid, 0)
        if not parts:
            raise RuntimeError("the timeline's forked process ended without a result")
        done, value = pickle.loads(b"".join(parts))
        if not done:
            raise RuntimeError(f"the timeline's forked process failed: {value}")
        return value

    return wait


def _can_fork() -> bool:
    """Linux with ``fork``, one thread (forking a threaded process can deadlock the child)."""
    return (
        sys.platform.startswith("linux")
        and hasattr(os, "fork")
        and threading.active_count() == 1
        and (os.cpu_count() or 1) > 1
    )


def _range_cuts(spill: Any, end_us: float, points: int) -> list[int]:
    """Where the ranges of buckets begin, after the first (at bucket 0): the buckets of the
    iterations ``r / RANGES`` of the way (their starts as the index knows them: interpolated
    between their chunk's first and last); none for a short run."""
    if spill.iterations < SPLIT_MIN_ITERATIONS:
        return []
    width, chunks = end_us / points, spill.chunks
    cuts: set[int] = set()
    at = 0
    for r in range(1, RANGES):
        index = spill.iterations * r // RANGES
        while chunks[at].first + chunks[at].count <= index:
            at += 1
        c = chunks[at]
        start = c.first_start_us + (c.last_start_us - c.first_start_us) * (
            (index - c.first) / c.count
        )
        cuts.add(min(int(start / width), points - 1))
    return sorted(k for k in cuts if 0 < k < points)


def _sum_range(
    reader: Any,
    chunks: list[Any],
    end_us: float,
    points: int,
    lo: int,
    hi: int,
    deferred: dict[int, float],
) -> BucketPart:
    sums = BucketSums(end_us, points, lo, hi, frozenset(deferred))
    for chunk in chunks:
        if not sums.add(chunk.first, reader.read(chunk)):
            break
    return sums.finish()
