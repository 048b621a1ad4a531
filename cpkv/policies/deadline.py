"""cpkv's ``deadline`` waiting-queue order: earliest deadline first, with an aging bound.

A request's deadline is its arrival plus its own ``deadline_ms`` (JSONL field; relative to
its arrival), else plus ``admit.slo.ttft_ms``, else none (after every request that has
one). Before each admission pass the queue is ordered:

1. *aged* requests first: those that have waited (since arrival) at least
   ``admit.deadline.aging_ms``, oldest arrival first: whatever the deadlines, no request
   waits much longer than the aging bound plus the time to admit the aged requests before
   it (no starvation);
2. then the others by deadline, earliest first;

ties by arrival, then by input position. The sort is total, so the order never depends
on the order the queue was in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cpkv.core.schema.limits import Milliseconds

INF = float("inf")


@dataclass(frozen=True)
class DeadlineSpec:
    """``admit.deadline``: the aging bound of ``schedule_policy: deadline`` (mode serving)."""

    aging_ms: Milliseconds = 60_000.0


def deadline_key(now_us: float, aging_us: float) -> Callable[[Any], tuple]:
    """The sort key at ``now_us`` over requests with ``arrival_us``, ``deadline_us`` (inf:
    none) and ``index``."""

    def key(r: Any) -> tuple:
        if now_us - r.arrival_us >= aging_us:
            return (0, r.arrival_us, 0.0, r.index)
        return (1, r.deadline_us, r.arrival_us, r.index)

    return key


def deadline_sort(queue: list[Any], now_us: float, aging_us: float) -> None:
    """Order ``queue`` in place (see the module docstring)."""
    queue.sort(key=deadline_key(now_us, aging_us))
