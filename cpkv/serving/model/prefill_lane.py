"""The prefilling requests of a token budget that reaches them all: each computes the same
chunk every iteration, so their progress is kept lazily (:class:`PrefillLane`).

Under the block policies every admitted request whose prompt is not complete computes
``min(left, chunk_tokens)`` tokens an iteration while the iteration's budget covers a full
chunk for each of them. In such an iteration (*uniform*) nothing but a step counter
changes: a member's filled tokens are ``base + chunk x steps``, the members' sum is one
aggregate, and the members whose prompt ends within a chunk (*due*) come off a heap keyed by
``fill - base``. Anything that reads members one by one (the invariants) first writes their
filled tokens out (:meth:`PrefillLane.settle`); one whose tokens change alone (a row of a
budget that runs out before the last member) leaves and joins again.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable
from typing import Final

from cpkv.serving.model.request import Req

NO_MEMBER: Final = 1 << 62
"""``PrefillLane.least`` with no members."""
UNKNOWN: Final = -1
"""``PrefillLane.least`` when the member that had it left."""


class PrefillLane:
    """Lazily advanced prefilling requests computing ``chunk`` tokens a uniform iteration."""

    __slots__ = (
        "chunk", "steps", "count", "base_sum", "heap", "due", "due_at", "tokens", "least"
    )  # fmt: skip

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.steps = 0  # uniform iterations so far
        self.count = self.base_sum = 0
        self.heap: list[tuple[int, int, int, Req]] = []  # (fill - base, stamp, token, member)
        self.due: list[tuple[int, Req]] = []  # (token, member): prompt ends in the next step
        self.due_at = -1  # the steps ``due`` was taken at
        self.tokens = 0  # the last token handed out
        self.least = NO_MEMBER  # the members' least fill - base (UNKNOWN: to be looked up)

    # -- members -----------------------------------------------------------------------------
    def join(self, r: Req) -> None:
        """``r`` (its filled tokens written out) becomes a member."""
        base = r.filled_tokens - self.chunk * self.steps
        self.tokens += 1
        r.lane_base, r.lane_token = base, self.tokens
        self.count += 1
        self.base_sum += base
        heap = self.heap
        if len(heap) > 4 * self.count + 64:  # mostly entries of members that left
            heap[:] = [e for e in heap if e[3].lane_token == e[2]]
            heapq.heapify(heap)
        key = r.fill_tokens - base
        heapq.heappush(heap, (key, r.stamp, self.tokens, r))
        if key < self.least:  # (UNKNOWN stays unknown)
            self.least = key
        if key <= self.chunk * (self.steps + 1):  # due now: the list of due members changes
            self.due_at = -1

    def leave(self, r: Req) -> None:
        """``r`` stops being a member (its filled tokens written out first)."""
        self.settle_one(r)
        self.count -= 1
        self.base_sum -= r.lane_base
        if r.fill_tokens - r.lane_base == self.least:
            self.least = UNKNOWN
        r.lane_token = 0  # (its heap entry, and its place among the due, are stale)

    def settle_one(self, r: Req) -> None:
        """Write member ``r``'s filled tokens out (and the tokens it computed)."""
        filled = r.lane_base + self.chunk * self.steps
        r.prefilled += filled - r.filled_tokens
        r.filled_tokens = filled

    def settle(self, members: Iterable[Req]) -> None:
        """Write every member's filled tokens out."""
        for r in members:
            self.settle_one(r)

    # -- uniform iterations --------------------------------------------------------------------
    def filled_sum(self) -> int:
        """The members' filled tokens, summed."""
        return self.base_sum + self.count * self.chunk * self.steps

    def due_members(self) -> list[Req]:
        """The members whose prompt ends within the next uniform iteration's chunk (``left <=
        chunk``), in admission order; they stay members until they leave."""
        if self.due_at == self.steps:
            return [r for token, r in self.due if r.lane_token == token]
        limit = self.chunk * (self.steps + 1)  # fill - base <= chunk x (steps + 1)
        heap = self.heap
        due = [(token, r) for token, r in self.due if r.lane_token == token]
        while heap and heap[0][0] <= limit:
            _, _, token, r = heapq.heappop(heap)
            if r.lane_token == token:
                due.append((token, r))
        if len(due) > 1:
            due.sort(key=_stamp)
        self.due, self.due_at = due, self.steps
        return [r for _, r in due]

    def next_due(self) -> tuple[int, bool]:
        """``(steps, whole)``: the uniform iterations before the next one in which a
        member's prompt ends, and whether every member whose prompt ends in that one
        computes a whole chunk in it (its tokens left a multiple of the chunk: that
        iteration takes the same tokens as those before it). The member with the least
        ``fill - base`` ends first (every member's tokens left fall by the same chunk a
        step), at the step ``(fill - base - 1) // chunk``."""
        least = self.least
        if least < 0:
            least = self.least = self._least_key()
        if least == NO_MEMBER:
            return 1 << 62, False
        chunk = self.chunk
        return (least - 1) // chunk - self.steps, least % chunk == 0

    def _least_key(self) -> int:
        """The members' least ``fill - base`` (NO_MEMBER: none), from the due members and
        the heap (its stale top entries dropped)."""
        least = NO_MEMBER
        for token, r in self.due:
            if r.lane_token == token:
                key = r.fill_tokens - r.lane_base
                if key < least:
                    least = key
        heap = self.heap
        while heap and heap[0][3].lane_token != heap[0][2]:
            heapq.heappop(heap)
        if heap and heap[0][0] < least:
            least = heap[0][0]
        return least

    def complete(self, due: list[Req]) -> None:
        """The next uniform iteration completes the prompts of ``due`` (its due members):
        they leave with their prompt filled, and the lane takes that iteration's step."""
        for r in due:
            self.leave(r)
            r.prefilled += r.fill_tokens - r.filled_tokens
            r.filled_tokens = r.fill_tokens
        self.steps += 1

    def advance(self, steps: int) -> None:
        """``steps`` uniform iterations in which no member's prompt ends."""
        self.steps += steps


SCAN_UP_TO: Final = 32
"""Lists up to this long are searched by a scan (identity, in C), longer ones by bisection."""


def remove_in_order(requests: list[Req], gone: list[Req]) -> None:
    """Remove ``gone`` (each in ``requests``, a list in admission order, as the prefilling
    requests are) from ``requests``: a short list scanned, a long one bisected on their
    admission stamps."""
    for r in gone:
        if len(requests) <= SCAN_UP_TO:
            requests.remove(r)
        else:
            del requests[bisect_left(requests, r.stamp, key=admission_stamp)]


def admission_stamp(r: Req) -> int:
    """``r``'s admission stamp (the order of the prefilling requests)."""
    return r.stamp


def _stamp(entry: tuple[int, Req]) -> int:
    return entry[1].stamp
