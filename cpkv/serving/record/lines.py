"""The ``requests.jsonl`` lines of a batch of request records, written with numpy.

A line is the JSON object ``json.dumps(..., separators=(",", ":"))`` writes for the request,
its times rounded by ``round(x, 6)``. :func:`format_lines` writes it byte for byte without a
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
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import numpy as np

STATUSES = ("rejected", "finished", "timed_out", "cancelled")
"""The terminal states, by code (``finished`` = 1, ``rejected`` = 0)."""
REASONS: list[str | None] = [
    None,
    "exceeds_kv_capacity",
    "preempted",
    "waiting",
    "prefilling",
    "running",
    "exceeds_max_model_len",
    "exceeds_context_len",
]
"""Reasons: a rejection's; where a timed-out or cancelled request was (a record holds its
position here: new reasons go last)."""
_quote = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]  # json's own, in C
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_PLAIN = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]*")
"""Text that JSON writes as it is: printable ASCII but ``"`` and ``\\``."""


def format_lines(
    f: np.ndarray, lat: dict[str, np.ndarray], rids: list[str], more: Sequence[np.ndarray] = (),
) -> str:  # fmt: skip
    """The ``requests.jsonl`` lines of records ``f`` (see the module docstring); ``more``:
    columns (NUL-padded rows, :func:`text_column`, :func:`integer_column`,
    :func:`time_column`) that end each line, before its closing brace."""
    n = len(f)
    columns: list[np.ndarray] = []

    def text(literal: str) -> None:
        columns.append(text_column(literal, n))

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
        columns.append(time_column(values))
    ints = (
        ("prompt_tokens", "prompt"), ("max_new_tokens", "max_new"), ("output_tokens", "output"),
        ("computed_prompt_tokens", "computed"), ("preemptions", "preemptions"),
        ("recomputed_tokens", "recomputed"), ("l1_hit_tokens", "l1"), ("l2_hit_tokens", "l2"),
    )  # fmt: skip
    for name, field in ints:
        text(f',"{name}":')
        columns.append(integer_column(f[field]))
    columns.extend(more)
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


def text_column(literal: str, n: int) -> np.ndarray:
    """``literal`` on each of ``n`` rows."""
    return np.broadcast_to(np.frombuffer(literal.encode(), dtype=np.uint8), (n, len(literal)))


def time_column(x: np.ndarray) -> np.ndarray:
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
    """``round(x * 10**6)`` computed exactly (ties to even) for ``0 <= x < 1e9``: the float
    product rounded to the nearest integer; where that product lies halfway between two
    integers, its rounding error (Dekker) says on which side the exact product lies."""
    y = x * 64.0  # exact: 10**6 = 64 * 15625
    p = y * 15625.0  # the float product, rounded
    nearest = np.rint(p)  # ties to even
    tie = np.flatnonzero(p - np.floor(p) == 0.5)
    if len(tie):
        y, p = y[tie], p[tie]
        split = y * 134217729.0  # Veltkamp split of y into 26 + 27 bits
        high = split - (split - y)
        low = y - high
        err = (high * 15625.0 - p) + low * 15625.0  # Dekker: p + err == y * 15625 exactly
        below = np.floor(p)
        nearest[tie] = np.where(err > 0, below + 1.0, np.where(err < 0, below, nearest[tie]))
    return nearest.astype(np.int64)


def integer_column(v: np.ndarray) -> np.ndarray:
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
