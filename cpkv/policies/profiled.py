"""cpkv's ``profiled`` reservation: reserve the prompt plus a quantile of the output lengths
seen so far (a probabilistic, profiled admission).

:class:`OutputQuantile` keeps the output lengths of the last ``window`` finished requests
and answers their ``quantile`` by nearest rank: the ``ceil(q x n)``-th smallest of the
``n`` kept (``q = 0``: the smallest). Before the first request finished it answers
``cold_start_tokens`` (None: the caller's fallback, the request's own ``max_new_tokens``,
i.e. conservative until there is data). A request reserves ``min(max_new_tokens,
quantile)`` output tokens (:meth:`OutputQuantile.reserve`): never more than it may generate.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Annotated

from cpkv.core.schema import Range, require
from cpkv.core.schema.limits import MAX_TOKENS, Tokens


@dataclass(frozen=True)
class ProfiledSpec:
    """``admit.profiled``: the ``profiled`` policy's reservation (mode serving).

    * ``quantile``: of the finished requests' output lengths, in [0, 1];
    * ``window``: how many of the latest finished requests count;
    * ``cold_start_tokens``: reserved output tokens before any request finished (null: each
      request's ``max_new_tokens``, as ``conservative``).
    """

    quantile: float = 0.9
    window: Annotated[
        int, Range(0, MAX_TOKENS, low_open=True, why="requests kept in memory, at most int32's")
    ] = 1000
    cold_start_tokens: Tokens | None = None

    def validate(self) -> None:
        require(0.0 <= self.quantile <= 1.0, "quantile", f"must be in [0, 1], got {self.quantile}")


class OutputQuantile:
    """The online estimator (see the module docstring)."""

    __slots__ = ("quantile", "window", "cold_start", "recent", "ordered", "seen")

    def __init__(self, spec: ProfiledSpec) -> None:
        self.quantile, self.window, self.cold_start = (
            spec.quantile,
            spec.window,
            spec.cold_start_tokens,
        )
        self.recent: deque[int] = deque()
        self.ordered: list[int] = []
        self.seen = 0

    def observe(self, output_tokens: int) -> None:
        """A request finished with ``output_tokens`` generated."""
        self.seen += 1
        self.recent.append(output_tokens)
        bisect.insort(self.ordered, output_tokens)
        if len(self.recent) > self.window:
            old = self.recent.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, old)]

    def value(self) -> int | None:
        """The quantile of the kept lengths (None before any finished: cold start)."""
        n = len(self.ordered)
        if n == 0:
            return self.cold_start
        rank = max(1, math.ceil(self.quantile * n - 1e-12))
        return self.ordered[rank - 1]

    def reserve(self, max_new_tokens: int) -> int:
        """Output tokens a request asking ``max_new_tokens`` reserves now."""
        q = self.value()
        return max_new_tokens if q is None or q > max_new_tokens else q
