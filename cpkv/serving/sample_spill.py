"""The spilled samples of a long serving run, waiting for the makespan (the timeline's bucket
width): an unlinked temporary file of chunks and their index in memory.

A chunk holds the iterations of one expanded batch (:meth:`~cpkv.serving.iteration_log.
IterationLog.process`), column by column, each as compact as it allows:

* the durations (µs), always as doubles; the starts are not stored: they are the durations'
  sequential sums from the logged start of each run of iterations the loop ran back to back
  (the chunk's first and those after idle time, kept in the index), recomputed by the same
  additions when read;
* the seven breakdown columns after the time (the six parts and the FLOPs,
  :data:`~cpkv.serving.cost.report.FIELDS`): one float when equal in every iteration of the
  chunk (the overhead, the all-reduce without tensor parallelism, the load-back of a chunk
  with none, the linear model's zeros), as runs of equal values when there are few (a decode
  stretch's GEMM and elementwise parts), else as doubles;
* the KV blocks used and held and the requests running and waiting: one integer when equal
  in every iteration, else in the narrowest unsigned type that holds them.

A run of a million requests spills about 22 to 34 bytes per iteration (the roofline model's
attention and FLOPs vary in every iteration, the linear model's attention only). The index
keeps, per chunk, where it is, its first iteration, its first start, last start and last
stop (a reader of some buckets reads only the chunks that reach them) and how each column is
stored. Chunks are read back with ``preadv`` into buffers of the reader's: two readers (two
processes, sharing the file's descriptor) can read different chunks at once.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

PARTS = 7
"""Breakdown columns after the time (the six parts and the FLOPs)."""
COUNTS = 4
"""Integer columns: used blocks, held blocks, running requests, waiting requests."""
RUNS_AT_MOST = 0.25
"""A breakdown column is stored as runs of equal values when it has at most this many runs
per iteration."""
_UNSIGNED = (np.uint8, np.uint16, np.uint32, np.uint64)


@dataclass(frozen=True)
class SpilledChunk:
    """Where one chunk is and what the index knows of it (module docstring)."""

    offset: int
    size: int  # bytes
    first: int  # its first iteration's index in the run
    count: int
    starts: tuple[tuple[int, float], ...]  # (first iteration in the chunk, its start) per run
    first_start_us: float
    last_start_us: float
    last_stop_us: float  # the last start + its duration (as the timeline adds them)
    parts: tuple[Any, ...]  # breakdown columns 1..7: a float, an int (runs), None (doubles)
    counts: tuple[Any, ...]  # used, held, running, waiting: an int, or their stored dtype

    @property
    def stored(self) -> list[int]:
        """The breakdown columns (0..7) a reader gives as rows, in order: the durations, the
        columns stored as doubles, those stored as runs."""
        dense = [1 + j for j, p in enumerate(self.parts) if p is None]
        runs = [1 + j for j, p in enumerate(self.parts) if isinstance(p, int)]
        return [0, *dense, *runs]


def constant_or_array(values: Any) -> Any:
    """``values`` (a float array) as one float when every element is that float (``0.0`` and
    ``-0.0`` alike: added to a sum, as the timeline does, they change nothing), else itself."""
    if isinstance(values, float):
        return values
    if not len(values):
        return 0.0
    first = values[0]
    if first == values[-1] and bool((values == first).all()):
        return float(first)
    return values


class SampleSpill:
    """The temporary file (created in ``directory``, None: the system's) and its index."""

    def __init__(self, directory: Any) -> None:
        self.file: Any = tempfile.TemporaryFile(prefix="cpkv-samples-", dir=directory)
        self.chunks: list[SpilledChunk] = []
        self.size = 0  # bytes written
        self.iterations = 0

    def append(
        self,
        dt: Any,
        starts: list[tuple[int, float]],
        t0: Any,
        counts: tuple[Any, ...],
        parts: list[Any],
    ) -> None:
        """The next ``n`` iterations: durations; ``starts`` ``(first iteration, its start)`` of
        each run of back-to-back iterations (the first at 0), ``t0`` the starts they give;
        ``counts`` (used, held, running, waiting: non-negative integer arrays) and the seven
        breakdown columns after the time (float arrays, or floats:
        :func:`constant_or_array`)."""
        n = len(dt)
        if not n:
            return
        parts = [constant_or_array(p) for p in parts]
        dense: list[Any] = [np.asarray(dt, dtype=np.float64)]
        runs: list[Any] = []
        kinds: list[Any] = []
        for values in parts:
            if isinstance(values, float):
                kinds.append(values)
                continue
            probe = values[:4096]  # (a column that changes at every step: no full look)
            if np.count_nonzero(probe[1:] != probe[:-1]) > 2 * RUNS_AT_MOST * len(probe):
                dense.append(values)
                kinds.append(None)
                continue
            heads = np.flatnonzero(values[1:] != values[:-1]) + 1
            if len(heads) + 1 <= RUNS_AT_MOST * n:
                heads = np.concatenate(([0], heads))
                runs.append((values[heads], np.diff(np.append(heads, n)).astype(np.int32)))
                kinds.append(len(heads))
            else:
                dense.append(values)
                kinds.append(None)
        stored_counts: list[Any] = []
        count_kinds: list[Any] = []
        for values in counts:
            low, high = int(values.min()), int(values.max())
            if low == high:
                count_kinds.append(low)
                continue
            if low < 0:
                raise ValueError("internal error: a negative count in the samples")
            dtype = next(t for t in _UNSIGNED if high <= np.iinfo(t).max)
            stored_counts.append(values.astype(dtype))
            count_kinds.append(np.dtype(dtype))
        size = 0
        for block in (
            *dense, *(v for v, _ in runs), *(lengths for _, lengths in runs), *stored_counts
        ):  # fmt: skip
            block.tofile(self.file)
            size += block.nbytes
        last = float(t0[-1])
        self.chunks.append(
            SpilledChunk(
                self.size,
                size,
                self.iterations,
                n,
                tuple(starts),
                float(t0[0]),
                last,
                last + float(dt[-1]),
                tuple(kinds),
                tuple(count_kinds),
            )  # fmt: skip
        )
        self.size += size
        self.iterations += n

    def constant_parts(self) -> dict[int, float]:
        """The breakdown columns (1..7) that are one float in every chunk, the same bits."""
        out: dict[int, float] = {}
        for j in range(PARTS):
            kinds = [c.parts[j] for c in self.chunks]
            if kinds and all(isinstance(k, float) for k in kinds):
                bits = {np.float64(k).tobytes() for k in kinds}
                if len(bits) == 1:
                    out[1 + j] = kinds[0]
        return out

    def start_us(self, index: int) -> float:
        """The start of the run's iteration ``index``."""
        chunk = next(c for c in self.chunks if c.first + c.count > index)
        return float(self.reader().read(chunk).t0[index - chunk.first])

    def reader(self) -> SpillReader:
        """A reader of chunks with buffers of its own (the file flushed first)."""
        self.file.flush()
        return SpillReader(self)

    def close(self) -> None:
        """Close the file (it was unlinked when created)."""
        self.file.close()


@dataclass
class ReadChunk:
    """One chunk read back: starts and stops (start + duration), ``floats`` the ``(len(
    stored), n)`` breakdown columns :attr:`SpilledChunk.stored` (durations first; ours to
    overwrite), ``constants`` the others (``{column: value}``), ``counts`` the four integer
    columns (arrays, or ints)."""

    t0: Any
    stop: Any
    floats: Any
    stored: list[int]
    constants: dict[int, float]
    counts: list[Any]


class SpillReader:
    """Reads chunks of a :class:`SampleSpill` into buffers of its own."""

    def __init__(self, spill: SampleSpill) -> None:
        self.spill = spill
        self.floats = np.empty(0)
        self.rest = np.empty(0, dtype=np.uint8)
        self.sums = np.empty(0)

    def read(self, chunk: SpilledChunk) -> ReadChunk:
        """One chunk (:class:`ReadChunk`): views of the buffers, valid until the next read."""
        n = chunk.count
        stored = chunk.stored
        rows = len(stored)
        dense = 1 + sum(p is None for p in chunk.parts)
        if self.floats.size < rows * n:
            self.floats = np.empty(rows * n)
        floats = self.floats[: rows * n].reshape(rows, n)
        rest_size = chunk.size - 8 * dense * n
        if self.rest.size < rest_size:
            self.rest = np.empty(rest_size, dtype=np.uint8)
        views = [memoryview(floats[:dense]).cast("B"), memoryview(self.rest[:rest_size])]
        _read_into(self.spill.file.fileno(), views, chunk.offset, chunk.size)
        at = 0
        runs = [p for p in chunk.parts if isinstance(p, int)]
        values = []
        for m in runs:
            values.append(self.rest[at : at + 8 * m].view(np.float64))
            at += 8 * m
        for r, m in enumerate(runs):
            lengths = self.rest[at : at + 4 * m].view(np.int32)
            at += 4 * m
            floats[dense + r] = np.repeat(values[r], lengths)
        counts: list[Any] = []
        for kind in chunk.counts:
            if isinstance(kind, int):
                counts.append(kind)
            else:
                counts.append(self.rest[at : at + kind.itemsize * n].view(kind))
                at += kind.itemsize * n
        t0, stop = self._starts(chunk, floats[0])
        constants = {1 + j: p for j, p in enumerate(chunk.parts) if isinstance(p, float)}
        return ReadChunk(t0, stop, floats, stored, constants, counts)

    def _starts(self, chunk: SpilledChunk, dt: Any) -> tuple[Any, Any]:
        """The starts, by the loop's own additions from each run's start, and the stops
        (each start + its duration: the next sum)."""
        n = chunk.count
        if self.sums.size < n + 1:
            self.sums = np.empty(n + 1)
        if len(chunk.starts) == 1:  # one run (the commonest): both are views of the sums
            sums = self.sums[: n + 1]
            sums[0] = chunk.starts[0][1]
            sums[1:] = dt
            np.cumsum(sums, out=sums)  # sequential: the loop's own additions
            t0, stop = sums[:-1], sums[1:]
        else:
            t0, stop = np.empty(n), np.empty(n)
            bounds = [*(i for i, _ in chunk.starts), n]
            for r, (lo, start) in enumerate(chunk.starts):
                hi = bounds[r + 1]
                sums = self.sums[: hi - lo + 1]
                sums[0] = start
                sums[1:] = dt[lo:hi]
                np.cumsum(sums, out=sums)
                t0[lo:hi] = sums[:-1]
                stop[lo:hi] = sums[1:]
        known = (chunk.first_start_us, chunk.last_start_us, chunk.last_stop_us)
        if (t0[0], t0[-1], stop[-1]) != known:
            raise RuntimeError("internal error: the spilled samples do not give their starts")
        return t0, stop


def _read_into(fd: int, views: list[memoryview], offset: int, size: int) -> None:
    """``size`` bytes at ``offset`` into ``views``, in order (``preadv`` may read less)."""
    done = 0
    while done < size:
        got = os.preadv(fd, views, offset + done)
        if got <= 0:
            raise RuntimeError("internal error: the spilled samples are shorter than written")
        done += got
        while got:
            if got >= len(views[0]):
                got -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][got:]
                got = 0
