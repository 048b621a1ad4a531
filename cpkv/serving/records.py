"""Per-request records of a serving run: packed when a request ends, then processed a batch
at a time in input order with numpy: the ``requests.jsonl`` lines and the latency
statistics (:class:`RequestStats`).

A line is the JSON object ``json.dumps(..., separators=(",", ":"))`` writes for the request
(:func:`cpkv.serving.metrics.request_line` builds the same one request by request), its
times rounded by ``round(x, 6)``. :func:`format_lines` writes it byte for byte without a
Python call per number:

* a rounded time prints as ``repr(round(x, 6))``, which for ``1e-4 <= x < 999999999`` is the
  integer ``N = round(x * 10**6)`` (correctly rounded, ties to even: the digits that
  ``round`` and ``'%.6f'`` produce) written as ``N // 10**6`` "." and the six digits of
  ``N % 10**6`` without their trailing zeros (one digit kept): such a decimal has at most 15
  significant digits, so it is the shortest repr of the float nearest to it, and ``repr``
  writes numbers in that range without an exponent. ``x * 10**6`` is computed exactly as
  the float product plus its rounding error (Dekker's two-product: ``10**6 = 64 x 15625``),
  which decides the ties. Any other value (below 1e-4 but not 0, 1e9 or more, negative,
  ``-0.0``) is written by ``repr(round(x, 6))`` itself;
* integers and the strings (``rid`` quoted by :mod:`json`'s own encoder) are copied in;
* each field is laid out in a fixed-width column of a byte matrix, with NUL bytes where
  its text is shorter; the lines are the matrix's bytes with the NULs deleted.

The statistics follow :mod:`cpkv.serving.metrics`: latencies ``(t - arrival) / 1000``
computed as floats exactly as there, kept whole (8 bytes per request per series, so that
percentiles and means are exact), goodput by ``admit.slo``, counts.
"""

from __future__ import annotations

import json
import re
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cpkv.serving.kv_pool import CANCELLED, FINISHED, REJECTED, TIMED_OUT

SERIES = ("queue", "ttft", "tpot", "e2e")
NAN = float("nan")
RECORD = struct.Struct("<4d8q2B")
"""arrival, admitted, first token, finish (µs; NaN: none); prompt, max_new, output,
computed prompt tokens, preemptions, recomputed tokens, L1 hit, L2 hit (-1: none); the
terminal status' code (:data:`STATUSES`); the reason's code (0: none)."""
REASONS: list[str | None] = [
    None,
    "exceeds_kv_capacity",
    "preempted",
    "waiting",
    "prefilling",
    "running",
]
"""Reasons: a rejection's; where a timed-out or cancelled request was (issue 13)."""
STATUSES = ("rejected", "finished", "timed_out", "cancelled")
"""The terminal states, by code (``finished`` = 1, ``rejected`` = 0 as before)."""
_STATUS_CODE = {REJECTED: 0, FINISHED: 1, TIMED_OUT: 2, CANCELLED: 3}
BATCH = 4096
"""Records processed at a time."""

_quote = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]  # json's own, in C
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_PLAIN = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]*")
"""Text that JSON writes as it is: printable ASCII but ``"`` and ``\\``."""


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
    made). A record waits in memory only while an earlier request is still live."""

    def __init__(self, slo: Any, write: Callable[[str], Any] | None = None) -> None:
        self.slo, self.write = slo, write
        self.forward: Callable[[bytes, list[str]], Any] | None = None  # a helper process
        self.pending: dict[int, tuple[bytes, str]] = {}
        self.next_index = 0
        self.packed = bytearray()
        self.rids: list[str] = []
        self.series = {name: array("d") for name in SERIES}
        self.requests = self.finished = self.rejected = self.admitted = 0
        self.preemptions = self.recomputed = self.generated = self.good = 0
        self.timed_out = self.cancelled = 0
        self.longest_wait_ms: float | None = None

    def done(self, r: Any) -> None:
        """``r`` finished or was rejected: pack its record (processed in input order)."""
        admitted, first, end = r.admitted_us, r.first_token_us, r.finished_us
        l1, l2, reason = r.l1_hit, r.l2_hit, r.reject_reason
        record = RECORD.pack(
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
        if r.index == self.next_index:
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
            self.pending[r.index] = (record, r.rid)

    def flush(self) -> None:
        """Process the records that are in order (or hand them to ``forward``)."""
        if not self.rids:
            return
        packed, rids = bytes(self.packed), self.rids
        self.packed, self.rids = bytearray(), []
        if self.forward is not None:
            self.forward(packed, rids)
        else:
            self.process(packed, rids)

    def process(self, packed: bytes, rids: list[str]) -> None:
        """Records in input order: their statistics, their lines."""
        fields = np.frombuffer(packed, dtype=_DTYPE)
        lat = self._count(fields)
        if self.write is not None:
            self.write(format_lines(fields, lat, rids))

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
        from cpkv.serving.metrics import PERCENTILES, percentile

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


def format_lines(f: np.ndarray, lat: dict[str, np.ndarray], rids: list[str]) -> str:
    """The ``requests.jsonl`` lines of records ``f`` (see the module docstring)."""
    n = len(f)
    columns: list[np.ndarray] = []

    def text(literal: str) -> None:
        columns.append(
            np.broadcast_to(np.frombuffer(literal.encode(), dtype=np.uint8), (n, len(literal)))
        )

    if _PLAIN.fullmatch("".join(rids)):  # nothing to escape: the rid itself, between quotes
        text('{"rid":"')
        columns.append(np.array(rids, dtype=np.bytes_).view(np.uint8).reshape(n, -1))
        text('"')
    else:
        text('{"rid":')
        quoted = np.array([_quote(rid) for rid in rids], dtype=np.bytes_)
        columns.append(quoted.view(np.uint8).reshape(n, -1))
    text(',"status":"')
    columns.append(_STATUS_TEXT[f["finished"]].view(np.uint8).reshape(n, 9))
    text('","reason":')
    reasons = np.array([b"null" if r is None else _quote(r).encode() for r in REASONS])
    columns.append(reasons[f["reason"]].view(np.uint8).reshape(n, -1))
    times = (
        ("arrival_ms", f["arrival"] / 1000.0),
        ("admitted_ms", f["admitted"] / 1000.0),
        ("first_token_ms", f["first"] / 1000.0),
        ("finish_ms", f["finish"] / 1000.0),
        ("queue_ms", lat["queue"]),
        ("ttft_ms", lat["ttft"]),
        ("tpot_ms", lat["tpot"]),
        ("e2e_ms", lat["e2e"]),
    )
    for name, values in times:
        text(f',"{name}":')
        columns.append(_rounded6(values))
    ints = (
        ("prompt_tokens", "prompt"), ("max_new_tokens", "max_new"), ("output_tokens", "output"),
        ("computed_prompt_tokens", "computed"), ("preemptions", "preemptions"),
        ("recomputed_tokens", "recomputed"), ("l1_hit_tokens", "l1"), ("l2_hit_tokens", "l2"),
    )  # fmt: skip
    for name, field in ints:
        text(f',"{name}":')
        columns.append(_integers(f[field]))
    text("}\n")
    lines = np.concatenate(columns, axis=1)
    return lines.tobytes().translate(None, b"\0").decode("ascii")


_STATUS_TEXT = np.array([s.encode() for s in STATUSES], dtype="S9")  # NUL-padded to 9


def _table(make) -> np.ndarray:
    """4 bytes per 3-digit group ``k`` (``make(k)``: its text, NUL-padded to 4), as uint32."""
    rows = b"".join(make(f"{k:03d}").encode().ljust(4, b"\0") for k in range(1000))
    return np.frombuffer(rows, dtype=np.uint32)


def _lead(d: str) -> str:  # no leading zeros ("000": "0")
    kept = d.lstrip("0") or "0"
    return "\0" * (3 - len(kept)) + kept


_FULL = _table(lambda d: d)
_LEAD = _table(_lead)
_DOT = _table(lambda d: "." + d)  # "." and the first three digits of a fraction
_DOT_TRAIL = _table(lambda d: "." + (d.rstrip("0") or "0"))  # ... without trailing zeros
_TRAIL = _table(lambda d: d.rstrip("0"))  # the last three, without trailing zeros
_NULL = np.frombuffer(b"null" + b"\0" * 24, dtype=np.uint32)  # up to 7 groups (int64)


def _rounded6(x: np.ndarray) -> np.ndarray:
    """``repr(round(v, 6))`` of each value (``null`` for NaN) as NUL-padded rows of bytes."""
    n = len(x)
    null = np.isnan(x)
    fast = ((x >= 1e-4) & (x < 999_999_999.0)) | ((x == 0.0) & ~np.signbit(x))
    units = _times_million_rounded(np.where(fast, x, 0.0))
    whole, frac = np.divmod(units, 1_000_000)
    w2, rest = np.divmod(whole, 1_000_000)
    w1, w0 = np.divmod(rest, 1000)
    f1, f0 = np.divmod(frac, 1000)
    # the whole part without leading zeros (one digit kept), the fraction without trailing
    # zeros (one digit kept): 5 groups of 4 bytes
    out = np.empty((n, 5), dtype=np.uint32)
    out[:, 0] = np.where(w2 > 0, _LEAD[w2], 0)
    out[:, 1] = np.where(w2 > 0, _FULL[w1], np.where(w1 > 0, _LEAD[w1], 0))
    out[:, 2] = np.where(whole >= 1000, _FULL[w0], _LEAD[w0])
    out[:, 3] = np.where(f0 > 0, _DOT[f1], _DOT_TRAIL[f1])
    out[:, 4] = np.where(f0 > 0, _TRAIL[f0], 0)
    if null.any():
        out[null] = _NULL[:5]
    out8 = out.view(np.uint8)
    other = ~fast & ~null
    if not other.any():
        return out8
    slow = [repr(round(v, 6)).encode() for v in x[other].tolist()]
    width = max(20, max(len(t) for t in slow))
    if width > 20:
        out8 = np.concatenate([out8, np.zeros((n, width - 20), dtype=np.uint8)], axis=1)
    out8[np.flatnonzero(other)] = (
        np.array(slow, dtype=f"S{width}").view(np.uint8).reshape(len(slow), width)
    )
    return out8


def _times_million_rounded(x: np.ndarray) -> np.ndarray:
    """``round(x * 10**6)`` computed exactly (ties to even) for ``0 <= x < 1e9``."""
    y = x * 64.0  # exact: 10**6 = 64 * 15625
    p = y * 15625.0  # the float product, rounded
    split = y * 134217729.0  # Veltkamp split of y into 26 + 27 bits
    high = split - (split - y)
    low = y - high
    err = (high * 15625.0 - p) + low * 15625.0  # Dekker: p + err == y * 15625 exactly
    below = np.floor(p)
    nearest = np.rint(p)  # ties to even
    tie = p - below == 0.5
    nearest = np.where(tie & (err > 0), below + 1.0, np.where(tie & (err < 0), below, nearest))
    return nearest.astype(np.int64)


def _integers(v: np.ndarray) -> np.ndarray:
    """Non-negative integers (``null`` for -1) as NUL-padded rows of their digits."""
    n = len(v)
    null = v < 0
    u = np.where(null, 0, v)
    top = int(u.max()) if n else 0
    groups = -(-len(str(top)) // 3)
    out = np.empty((n, groups), dtype=np.uint32)
    leading = np.ones(n, dtype=bool)  # no nonzero group yet
    for g in range(groups):
        value = u // int(_POW10[3 * (groups - 1 - g)]) % 1000
        if g == groups - 1:
            out[:, g] = np.where(leading, _LEAD[value], _FULL[value])
        else:
            out[:, g] = np.where(leading, np.where(value > 0, _LEAD[value], 0), _FULL[value])
            leading &= value == 0
    if null.any():
        out[null] = _NULL[:groups]
    return out.view(np.uint8)
