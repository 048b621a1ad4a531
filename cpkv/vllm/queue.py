"""vLLM 0.32.0's waiting queues (``request_queue.py``): fcfs is a deque, priority a heap.

fcfs: arrivals go to the back, a preempted request to the front. priority: a heap on
``(priority, arrival_time, request_id)``; "prepending" a preempted request is a plain push.
Iteration gives the order the queue would pop in.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from cpkv.vllm.request import Request


class FcfsQueue:
    """First come, first served; a preempted request goes back to the head."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._items.append(request)

    def prepend(self, request: Request) -> None:
        self._items.appendleft(request)

    def peek(self) -> Request:
        return self._items[0]

    def pop(self) -> Request:
        return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)


class PriorityQueue:
    """Lowest ``(priority, arrival_time, request_id)`` first."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, str, Request]] = []

    def add(self, request: Request) -> None:
        heapq.heappush(
            self._heap, (request.priority, request.arrival_time, request.request_id, request)
        )

    def prepend(self, request: Request) -> None:
        """A preempted request goes back by its key, like any other."""
        self.add(request)

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._heap))


def make_queue(policy: str) -> FcfsQueue | PriorityQueue:
    """The waiting queue for a scheduling policy (``fcfs`` or ``priority``)."""
    if policy == "priority":
        return PriorityQueue()
    if policy == "fcfs":
        return FcfsQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}")
