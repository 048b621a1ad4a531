"""What each side of a disaggregated deployment counts of its requests.

* :class:`PrefillTally`: one prefill instance's requests as its router sees them: routed
  there, outstanding until they leave (handed off after their first token, or ended there:
  rejected, or finished after at most one token); their prefix hits; the handoffs. The
  requests that end there go to the run's request records;
* :class:`HandoffRecord`: every request's handoff (its prefill and decode instances, when
  it left the prefill instance, when its KV landed, its bytes) by its number in the run,
  the TTFT split of the requests a decode instance took in (queue, prefill, transfer,
  decode wait), and the ``requests.jsonl`` fields it adds (:class:`HandoffColumns`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from cpkv.serving.model.request import FINISHED, PENDING, Req
from cpkv.serving.record.lines import integer_column, text_column, time_column

INF: Final = float("inf")
NAN: Final = float("nan")
SPLIT = ("queue", "prefill", "transfer", "decode_wait")
"""The parts of a TTFT: arrival to the prefill side's admission, to its first token (the
handoff), to the KV's landing on the decode instance, to the decode instance taking it in."""


@dataclass
class PrefillTally:
    """One prefill instance's requests (the module docstring); ``sink`` takes the requests
    that end on it."""

    instance: int
    sink: Any
    routed: int = 0
    ended: int = 0  # left: handed off or ended here
    handed: int = 0
    prompt_tokens: int = 0  # of the requests admitted (their first admission's hits below)
    l1_hit_tokens: int = 0
    l2_hit_tokens: int = 0
    live: dict[int, tuple[Req, int]] = field(default_factory=dict)
    late: list[Req] = field(default_factory=list)  # left after the routing time
    routing_us: float = -INF
    on_done: Callable[[Req], Any] | None = None

    @staticmethod
    def gone_us(r: Req) -> float:
        """When ``r`` left: its handoff, or its end."""
        return r.handoff_us if r.handoff_us is not None else r.finished_us

    @staticmethod
    def taken(r: Req) -> bool:
        """Whether the instance took ``r`` into its queue (a request handed off is pending
        again, for the decode side)."""
        return r.state != PENDING or r.handoff_us is not None

    def _leave(self, r: Req, at: float) -> None:
        self.live.pop(r.index)
        self.ended += 1
        if at > self.routing_us:
            self.late.append(r)
        if r.l1_hit is not None:
            self.prompt_tokens += r.prompt_tokens
            self.l1_hit_tokens += r.l1_hit
            self.l2_hit_tokens += r.l2_hit

    def left(self, r: Req) -> None:
        """``r`` was handed off (at ``r.handoff_us``)."""
        self.handed += 1
        self._leave(r, r.handoff_us)

    def done(self, r: Req) -> None:
        """``r`` ended on this instance."""
        self._leave(r, r.finished_us)
        self.sink.done(r)
        if self.on_done is not None:
            self.on_done(r)


class HandoffRecord:
    """Every request's handoff by its number (module docstring)."""

    def __init__(self) -> None:
        self.handoff_us = array("d")
        self.landed_us = array("d")
        self.kv_bytes = array("q")
        self.split: dict[str, array] = {name: array("d") for name in SPLIT}

    def _grow(self, index: int) -> None:
        size = len(self.handoff_us)
        if index >= size:  # (grown by doubling: the slots past the last handoff stay empty)
            missing = max(index + 1, 2 * size) - size
            self.handoff_us.extend([NAN] * missing)
            self.landed_us.extend([NAN] * missing)
            self.kv_bytes.extend([-1] * missing)

    def handed(self, r: Req, landed_us: float, size_bytes: int) -> None:
        """``r`` left its prefill instance at ``r.handoff_us``; its KV lands at ``landed_us``."""
        index = r.index
        self._grow(index)
        self.handoff_us[index] = r.handoff_us
        self.landed_us[index] = landed_us
        self.kv_bytes[index] = size_bytes

    def taken_in(self, r: Req) -> None:
        """``r`` ended on the decode side: its TTFT split, if a decode instance took it in."""
        if r.state != FINISHED or r.handoff_us is None or r.first_token_us is None:
            return
        landed = self.landed_us[r.index]
        split = self.split
        split["queue"].append((r.admitted_us - r.arrival_us) / 1000.0)
        split["prefill"].append((r.handoff_us - r.admitted_us) / 1000.0)
        split["transfer"].append((landed - r.handoff_us) / 1000.0)
        split["decode_wait"].append((r.first_token_us - landed) / 1000.0)

    def split_summary(self) -> dict[str, dict[str, float | None]]:
        """Mean, p50 and p99 (ms) of each part of the TTFT split."""
        out = {}
        for name in SPLIT:
            values = np.frombuffer(self.split[name], dtype=np.float64)
            if not len(values):
                out[name] = {"mean_ms": None, "p50_ms": None, "p99_ms": None}
                continue
            out[name] = {
                "mean_ms": round(float(values.mean()), 6),
                "p50_ms": round(float(np.percentile(values, 50)), 6),
                "p99_ms": round(float(np.percentile(values, 99)), 6),
            }
        return out


class HandoffColumns:
    """The ``columns`` of the run's request records (:class:`~cpkv.serving.record.requests.
    RequestStats`) that end each line with its handoff: ``prefill_instance``,
    ``decode_instance`` (null: it ended on its prefill instance), ``handoff_ms``,
    ``kv_landed_ms`` (null: no handoff), ``kv_bytes`` (0: none)."""

    def __init__(self, prefill_of: list[int], decode_of: list[int], record: HandoffRecord) -> None:
        self.prefill_of, self.decode_of, self.record = prefill_of, decode_of, record

    def __call__(self, first: int, n: int) -> list[np.ndarray]:
        record = self.record
        kv = _window(record.kv_bytes, first, n, -1, np.int64)  # (-1: no handoff)
        handed = kv >= 0
        handoff = np.where(handed, _window(record.handoff_us, first, n, NAN, np.float64), NAN)
        landed = np.where(handed, _window(record.landed_us, first, n, NAN, np.float64), NAN)
        return [
            text_column(',"prefill_instance":', n),
            integer_column(_window(self.prefill_of, first, n, -1, np.int64)),
            text_column(',"decode_instance":', n),
            integer_column(_window(self.decode_of, first, n, -1, np.int64)),
            text_column(',"handoff_ms":', n),
            time_column(handoff / 1000.0),
            text_column(',"kv_landed_ms":', n),
            time_column(landed / 1000.0),
            text_column(',"kv_bytes":', n),
            integer_column(np.where(handed, kv, 0)),
        ]


def _window(values: Any, first: int, n: int, missing: float, dtype: Any) -> np.ndarray:
    """``values[first : first + n]`` as an array of ``n``, ``missing`` past their end."""
    out = np.full(n, missing, dtype=dtype)
    known = np.asarray(values[first : first + n], dtype=dtype)
    out[: len(known)] = known
    return out
