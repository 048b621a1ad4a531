"""Per-request records of a serving run: packed when a request ends, then processed a batch
at a time in input order with numpy: the ``requests.jsonl`` lines
(:func:`~cpkv.serving.record.lines.format_lines`) and the latency statistics
(:class:`RequestStats`).

The statistics follow :mod:`cpkv.serving.record.metrics`: latencies ``(t - arrival) / 1000``
computed as floats, kept whole (8 bytes per request per series, so that percentiles and means
are exact), goodput by ``admit.slo``, counts.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from cpkv.serving.model.request import CANCELLED, FINISHED, REJECTED, TIMED_OUT, Req
from cpkv.serving.record.lines import REASONS, format_lines

SERIES = ("queue", "ttft", "tpot", "e2e")
NAN: Final = float("nan")
RECORD = struct.Struct("<4d8q2B")
"""arrival, admitted, first token, finish (µs; NaN: none); prompt, max_new, output,
computed prompt tokens, preemptions, recomputed tokens, L1 hit, L2 hit (-1: none); the
terminal status' code (:data:`~cpkv.serving.record.lines.STATUSES`); the reason's code (0: none)."""
_STATUS_CODE: Final = {REJECTED: 0, FINISHED: 1, TIMED_OUT: 2, CANCELLED: 3}
PERCENTILES = (50, 90, 95, 99)
BATCH: Final = 4096
"""Records processed at a time."""


@dataclass(frozen=True)
class RequestSummary:
    """A run's requests, counted (see :class:`RequestStats`)."""

    requests: int
    finished: int
    rejected: int
    admitted: int
    preemptions: int
    recomputed: int
    generated: int
    good: int
    latencies: dict[str, float | None]
    timed_out: int = 0
    cancelled: int = 0
    longest_wait_ms: float | None = None  # queue time before the first admission (or the end)


class RequestStats:
    """The requests of a run as they end (:meth:`done`): counts, latency series, goodput,
    and their ``requests.jsonl`` lines, handed to ``write`` in input order (None: lines not
    made), each ending with the ``columns`` of its batch (``columns(first, n)``: of the
    records ``first`` to ``first + n - 1``, in input order). A record waits in memory only
    while an earlier request is still live."""

    def __init__(
        self, slo: Any, write: Callable[[str], Any] | None = None,
        columns: Callable[[int, int], list[np.ndarray]] | None = None,
    ) -> None:  # fmt: skip
        self.slo, self.write, self.columns = slo, write, columns
        self.processed = 0  # records processed (their lines written), in input order
        self.pending: dict[int, tuple[bytes, str]] = {}
        self.next_index = 0
        self.packed = bytearray()
        self.rids: list[str] = []
        self.series = {name: array("d") for name in SERIES}
        self.pack = RECORD.pack
        self.requests = self.finished = self.rejected = self.admitted = 0
        self.preemptions = self.recomputed = self.generated = self.good = 0
        self.timed_out = self.cancelled = 0
        self.longest_wait_ms: float | None = None

    def done(self, r: Req, index: int = -1) -> None:
        """``r`` finished or was rejected: pack its record, processed in input order: ``r``'s
        own index's place, or ``index``'s (a request numbered apart, as an instance of a
        cluster numbers those routed to it)."""
        admitted, first, end = r.admitted_us, r.first_token_us, r.finished_us
        l1, l2, reason = r.l1_hit, r.l2_hit, r.reject_reason
        record = self.pack(
            r.arrival_us,
            NAN if admitted is None else admitted,
            NAN if first is None else first,
            NAN if end is None else end,
            r.prompt_tokens,
            r.max_new_tokens,
            r.generated,
            r.prefilled,
            r.preemptions,
            r.recomputed,
            -1 if l1 is None else l1,
            -1 if l2 is None else l2,
            _STATUS_CODE.get(r.state, 0),
            0 if reason is None else REASONS.index(reason),
        )
        if r.state not in _STATUS_CODE:
            raise ValueError(f"request {r.rid} has not ended")
        if index < 0:
            index = r.index
        if index == self.next_index:
            self.packed += record
            self.rids.append(r.rid)
            self.next_index += 1
            pending = self.pending
            while pending and self.next_index in pending:
                record, rid = pending.pop(self.next_index)
                self.packed += record
                self.rids.append(rid)
                self.next_index += 1
            if len(self.rids) >= BATCH:
                self.flush()
        else:
            self.pending[index] = (record, r.rid)

    def flush(self) -> None:
        """Process the records that are in order."""
        if not self.rids:
            return
        packed, rids = bytes(self.packed), self.rids
        self.packed, self.rids = bytearray(), []
        self.process(packed, rids)

    def process(self, packed: bytes, rids: list[str]) -> None:
        """Records in input order: their statistics, their lines."""
        fields = np.frombuffer(packed, dtype=_DTYPE)
        lat = self._count(fields)
        first, n = self.processed, len(rids)
        self.processed = first + n
        if self.write is not None:
            more = self.columns(first, n) if self.columns is not None else []
            self.write(format_lines(fields, lat, rids, more))

    def close(self) -> None:
        """Every request has ended: process the last records."""
        if self.pending:
            raise RuntimeError(
                f"internal error: request {self.next_index} never ended "
                f"({len(self.pending)} later ones did)"
            )
        self.flush()

    def _count(self, f: np.ndarray) -> dict[str, np.ndarray]:
        arrival = f["arrival"]
        finished = f["finished"] == 1
        queue = (f["admitted"] - arrival) / 1000.0
        ttft = (f["first"] - arrival) / 1000.0
        generated = f["output"]
        has_tpot = finished & ~np.isnan(f["first"]) & (generated >= 2)
        tpot = np.full(len(f), NAN)
        tpot[has_tpot] = (
            (f["finish"][has_tpot] - f["first"][has_tpot]) / 1000.0 / (generated[has_tpot] - 1)
        )
        e2e = np.where(finished, (f["finish"] - arrival) / 1000.0, NAN)
        ttft_shown = ttft  # the line shows a first token of a rejected request too
        self.requests += len(f)
        self.finished += int(finished.sum())
        status = f["finished"]
        self.rejected += int((status == 0).sum())
        self.timed_out += int((status == 2).sum())
        self.cancelled += int((status == 3).sum())
        waits = np.where(np.isnan(queue), (f["finish"] - arrival) / 1000.0, queue)
        if len(waits):
            top = float(np.nanmax(waits)) if not np.isnan(waits).all() else None
            if top is not None and (self.longest_wait_ms is None or top > self.longest_wait_ms):
                self.longest_wait_ms = top
        self.admitted += int((~np.isnan(queue)).sum())
        self.preemptions += int(f["preemptions"].sum())
        self.recomputed += int(f["recomputed"].sum())
        self.generated += int(generated[finished].sum())
        series = self.series
        series["queue"].frombytes(queue[~np.isnan(queue)].tobytes())
        for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
            keep = finished & ~np.isnan(values)
            series[name].frombytes(values[keep].tobytes())
        good = finished.copy()
        slo = self.slo
        if slo.ttft_ms is not None:
            good &= ~np.isnan(ttft) & (ttft <= slo.ttft_ms)
        if slo.tpot_ms is not None:
            good &= np.isnan(tpot) | (tpot <= slo.tpot_ms)
        self.good += int(good.sum())
        return {"queue": queue, "ttft": ttft_shown, "tpot": tpot, "e2e": e2e}

    def summary(self) -> RequestSummary:
        """What the summary row needs (after :meth:`close`)."""
        return RequestSummary(
            self.requests, self.finished, self.rejected, self.admitted, self.preemptions,
            self.recomputed, self.generated, self.good, self.latency_stats(),
            self.timed_out, self.cancelled, self.longest_wait_ms,
        )  # fmt: skip

    def latency_stats(self) -> dict[str, float | None]:
        """``<series>_mean_ms`` and ``<series>_p<q>_ms`` for every series, from all values."""
        stats: dict[str, float | None] = {}
        for name in SERIES:
            values = np.sort(np.frombuffer(self.series[name], dtype=np.float64))
            if len(values):
                total = float(np.cumsum(values)[-1])  # ascending, one by one, as sum() adds
                stats[f"{name}_mean_ms"] = total / len(values)
            else:
                stats[f"{name}_mean_ms"] = None
            listed = _Sorted(values)
            for q in PERCENTILES:
                stats[f"{name}_p{q}_ms"] = percentile(listed, q)
        return stats


def percentile(sorted_values: Any, q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation; None when empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = q / 100.0 * (n - 1)
    lo = int(rank)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


class _Sorted:
    """Sorted values, read as Python floats one at a time (what ``percentile`` reads)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, k: int) -> float:
        return float(self.values[k])


_DTYPE = np.dtype(
    [
        ("arrival", "<f8"), ("admitted", "<f8"), ("first", "<f8"), ("finish", "<f8"),
        ("prompt", "<i8"), ("max_new", "<i8"), ("output", "<i8"), ("computed", "<i8"),
        ("preemptions", "<i8"), ("recomputed", "<i8"), ("l1", "<i8"), ("l2", "<i8"),
        ("finished", "u1"), ("reason", "u1"),
    ]
)  # fmt: skip
assert _DTYPE.itemsize == RECORD.size
