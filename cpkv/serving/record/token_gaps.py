"""The gaps between consecutive output tokens of the requests of one serving instance, kept
as weighted records (the inter-token latency's values, :mod:`cpkv.serving.record.itl`).

A request's gap is the time between two of its consecutive tokens, a token being stamped at
the end of the iteration that emits it. Most gaps are one iteration long: a request that
emitted a token at the end of iteration ``i - 1`` and emits the next at the end of iteration
``i`` waits iteration ``i``'s duration; every such request of an iteration shares that gap.
They are counted per iteration: one record per iteration, or one per closed-form stretch
(its durations ``a + b s`` for its steps ``s``, each shared by the stretch's running
requests). A gap that spans more than one iteration (a request that sat out iterations: a
prefill batch that did not decode it, a preemption and its recompute) is logged with its own
value: the end of the iteration that emits the token minus the time of the request's token
before.

A record is ``(iteration, a, b, n, weight)``: ``weight`` gaps of each value ``a + b s`` for
``s`` in ``0 .. n - 1``, the ``s``-th one at iteration ``iteration + s`` (-1 for a gap of
several iterations, which belongs to none). Records are packed as they come and written, a
batch at a time and field by field (:class:`Gaps`), to an unlinked temporary file (under
``spill_dir``), so that memory does not grow with the run; ``keep`` holds the batches in
memory. A request that ends without finishing (cancelled, timed out, aborted) leaves the
pooled gaps: its one-iteration gaps are *withdrawn* by iteration range (:meth:`GapLog.
withdraw`, applied when the records are read), its longer ones by a record of weight -1.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from cpkv.serving.record.spill import Spill

RECORD = struct.Struct("<qddqd")
"""One record as logged: iteration, a, b, n, weight (see the module docstring)."""
FIELDS = (("iteration", np.int64), ("a", np.float64), ("b", np.float64), ("n", np.int64),
          ("weight", np.float64))  # fmt: skip
RECORD_DTYPE = np.dtype([(name, kind) for name, kind in FIELDS])
assert RECORD_DTYPE.itemsize == RECORD.size
FLUSH_RECORDS: Final = 8192
"""Records held before a batch is written out."""


@dataclass(frozen=True)
class Gaps:
    """A batch of records, one array a field (``weight`` in float64: whole numbers, exact
    below 2**53)."""

    iteration: Any  # each a numpy array
    a: Any
    b: Any
    n: Any
    weight: Any

    @classmethod
    def of(cls, data: bytes) -> Gaps:
        """A batch from its bytes (each field's array in turn)."""
        count = len(data) // RECORD.size
        arrays, offset = [], 0
        for _, kind in FIELDS:
            arrays.append(np.frombuffer(data, kind, count, offset))
            offset += 8 * count
        return cls(*arrays)

    def to_bytes(self) -> bytes:
        return b"".join(np.ascontiguousarray(getattr(self, f), k).tobytes() for f, k in FIELDS)

    def __len__(self) -> int:
        return len(self.a)

    def subset(self, keep: np.ndarray) -> Gaps:
        return Gaps(self.iteration[keep], self.a[keep], self.b[keep], self.n[keep],
                    self.weight[keep])  # fmt: skip

    def ends(self) -> tuple[np.ndarray, np.ndarray]:
        """Each record's least and greatest value (a line is monotonic in its steps)."""
        first, last = self.a, self.a + self.b * (self.n - 1)
        return np.minimum(first, last), np.maximum(first, last)


class GapLog:
    """The token gaps of one instance (module docstring)."""

    def __init__(self, keep: bool = False, spill_dir: Any = None) -> None:
        self.buffer = bytearray()
        self.pending = 0
        self.spilled = Spill(keep, spill_dir, "cpkv-gaps-")
        self.withdrawn: list[tuple[int, int]] = []
        self.low, self.high = np.inf, -np.inf  # the least and the greatest value logged

    # -- logging ---------------------------------------------------------------------------
    def point(self, iteration: int, value: float, weight: int) -> None:
        """``weight`` gaps of ``value`` µs: of iteration ``iteration``'s duration, or one
        gap of several iterations (``iteration`` -1)."""
        self.buffer += RECORD.pack(iteration, value, 0.0, 1, weight)
        self.pending += 1
        if self.pending >= FLUSH_RECORDS:
            self.flush()

    def line(self, iteration: int, a: float, b: float, first: int, stop: int, weight: int) -> None:
        """``weight`` gaps of each duration ``a + b j``, ``j`` in ``[first, stop)``: the
        iterations ``iteration`` .. ``iteration + stop - first - 1`` of a stretch (its
        first value is kept as ``a + b first``, the others follow by ``b``)."""
        if stop <= first:
            return
        self.buffer += RECORD.pack(iteration, a + b * first, b, stop - first, weight)
        self.pending += 1
        if self.pending >= FLUSH_RECORDS:
            self.flush()

    def stretch(self, iteration: int, durations: Any, steps: int, weight: int) -> None:
        """``weight`` gaps of each of the first ``steps`` durations of a stretch that starts
        at iteration ``iteration`` (:mod:`cpkv.serving.cost.stretch`: affine pieces, one
        record a piece, or any other model's durations one by one)."""
        pieces = getattr(durations, "pieces", None)
        if pieces is None:
            for j in range(steps):
                self.point(iteration + j, durations.duration(j), weight)
            return
        for i, (first, a, b) in enumerate(pieces):
            if first >= steps:
                break
            stop = pieces[i + 1][0] if i + 1 < len(pieces) else steps
            self.line(iteration + first, a, b, first, min(stop, steps), weight)

    def add(self, gaps: Gaps) -> None:
        """Many records at once."""
        self.flush()
        self._write(gaps)

    def withdraw(self, first: int, last: int) -> None:
        """One request's one-iteration gaps at iterations ``first`` .. ``last`` leave the
        pool (the request did not finish)."""
        if last >= first:
            self.withdrawn.append((first, last))

    def flush(self) -> None:
        """Write the records logged so far out (or keep them)."""
        if not self.pending:
            return
        rec = np.frombuffer(bytes(self.buffer), dtype=RECORD_DTYPE)
        self.buffer.clear()
        self.pending = 0
        self._write(Gaps(*(rec[name] for name, _ in FIELDS)))

    def _write(self, gaps: Gaps) -> None:
        if not len(gaps):
            return
        low, high = gaps.ends()
        self.low = min(self.low, float(low.min()))
        self.high = max(self.high, float(high.max()))
        self.spilled.append(gaps.to_bytes())

    def discard(self) -> None:
        """Close the temporary file (it was unlinked when created)."""
        self.spilled.discard()

    # -- reading back ----------------------------------------------------------------------
    def records(self) -> Iterator[Gaps]:
        """The records in batches, every record logged so far included."""
        self.flush()
        for (data,) in self.spilled:
            yield Gaps.of(data)

    def withdrawals(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The withdrawn iteration ranges as two sorted arrays: their firsts, and their lasts
        plus one (None: none)."""
        if not self.withdrawn:
            return None
        ranges = np.array(self.withdrawn, dtype=np.int64)
        return np.sort(ranges[:, 0]), np.sort(ranges[:, 1] + 1)


def expand(gaps: Gaps, withdrawals: tuple[np.ndarray, np.ndarray] | None):
    """The records' gaps one value at a time: ``(values, weights)`` (those of the records of
    one value first, then the others' in order), each weight less the withdrawn ranges that
    cover its iteration."""
    n = gaps.n
    single = n == 1
    points, lines = (gaps, None) if single.all() else (gaps.subset(single), gaps.subset(~single))
    if lines is None:
        values, weights, iteration = points.a, points.weight, points.iteration
    else:
        n = lines.n
        steps = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
        values = np.concatenate([points.a, np.repeat(lines.a, n) + np.repeat(lines.b, n) * steps])
        weights = np.concatenate([points.weight, np.repeat(lines.weight, n)])
        if withdrawals is not None:
            iteration = np.concatenate([points.iteration, np.repeat(lines.iteration, n) + steps])
    if withdrawals is not None:
        starts, ends = withdrawals
        covered = np.searchsorted(starts, iteration, "right") - np.searchsorted(
            ends, iteration, "right"
        )
        weights = weights - np.where(iteration >= 0, covered, 0)
    return values, weights
