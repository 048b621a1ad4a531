"""Requests as they arrive: the serving engine's arrivals, built lazily, in arrival order.

A run's requests are given in *input order* (the order of the file, the grid, the draws);
they arrive in *arrival order*: by arrival time (``admit.arrivals``), ties in input order.
A request becomes a :class:`~cpkv.serving.model.request.Req` (the engine's mutable state)
only when the engine reaches its arrival, and is dropped when it ends, so that a run of a million
requests never holds a million of them:

* a ``synthetic`` workload is drawn as it is read, request by request, with the same draws
  in the same order as :func:`cpkv.workload.synthetic.synthetic_requests` (its requests have
  no arrival time: with any process they arrive in input order);
* a repeated trace (``admit.workload.repeat``) keeps one copy of the trace and builds each
  copy's requests when the engine gets there (:func:`repeated_trace`);
* every other source is read whole (a file, a grid) and only its arrival order is computed
  up front.

Arrival times (:func:`arrival_times`) are those of :func:`cpkv.serving.input.workload.with_arrivals`,
number for number: ``poisson`` draws ``random.Random(seed).expovariate(rate_rps)`` in input
order, ``trace`` divides each request's own time by ``speedup``, ``zero`` is 0.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from cpkv.core.errors import ConfigError
from cpkv.serving.model.request import Req
from cpkv.workload.sampling import ExponentialSampler

INF: Final = float("inf")
COPY_HASH_STRIDE = 1 << 52
"""Copy ``c`` of a repeated trace has block hashes ``h + c * COPY_HASH_STRIDE``."""


class Upcoming:
    """The requests still to come to an instance, in the order they come: ``next_us`` is the
    next one's time (inf: none), :meth:`pop` takes it (there must be one)."""

    __slots__ = ("next_us",)

    def __init__(self) -> None:
        self.next_us = INF

    def pop(self) -> Req:
        """The next request."""
        raise NotImplementedError


class Arrivals(Upcoming):
    """Requests that have not arrived yet, in arrival order: read lazily from ``source``, or
    handed over one at a time by an outer driver (:meth:`deliver`). ``next_us`` is the next
    one's arrival time (inf: none)."""

    __slots__ = ("_source", "_queue", "_next")

    def __init__(self, source: Iterable[Req] | None = None) -> None:
        super().__init__()
        self._source = iter(source) if source is not None else None
        self._queue: deque[Req] = deque()
        self._next: Req | None = None
        self._step()

    def _step(self) -> None:
        r: Req | None
        if self._queue:
            r = self._queue.popleft()
        elif self._source is not None:
            r = next(self._source, None)
        else:
            r = None
        self._next = r
        self.next_us = INF if r is None else r.arrival_us

    def pop(self) -> Req:
        """The next request (there must be one: ``next_us`` is finite)."""
        r = self._next
        following: Req | None
        if self._queue:  # self._step(), inline
            following = self._queue.popleft()
        elif self._source is not None:
            following = next(self._source, None)
        else:
            following = None
        self._next = following
        self.next_us = INF if following is None else following.arrival_us
        return r  # type: ignore[return-value]

    def deliver(self, r: Req) -> None:
        """``r`` arrives after the requests delivered so far."""
        if self._source is not None:
            raise ValueError("this instance reads its own arrivals; deliver() is for a driver")
        last = self._queue[-1] if self._queue else self._next
        if last is not None and r.arrival_us < last.arrival_us:
            raise ValueError(f"request {r.rid} delivered out of arrival order")
        if self._next is None:
            self._next, self.next_us = r, r.arrival_us
        else:
            self._queue.append(r)


class Handoffs(Upcoming):
    """The requests that come to a decode instance: those whose KV is on its way to it, in
    landing order (delivered by the prefill side's handoffs)."""

    __slots__ = ("queue",)

    def __init__(self) -> None:
        super().__init__()
        self.queue: deque[tuple[float, Req]] = deque()

    def deliver(self, r: Req, landed_us: float) -> None:
        """``r``'s KV lands at ``landed_us`` (not before the KV delivered so far)."""
        queue = self.queue
        if queue and landed_us < queue[-1][0]:
            raise ValueError(f"request {r.rid}: KV delivered out of landing order")
        queue.append((landed_us, r))
        self.next_us = queue[0][0]

    def pop(self) -> Req:
        queue = self.queue
        _, r = queue.popleft()
        self.next_us = queue[0][0] if queue else INF
        return r


def arrival_order(requests: Sequence[Any]) -> Iterator[Req]:
    """``requests`` (input order, each with ``arrival_ms``) as Reqs in arrival order."""
    arrival_us = [r.arrival_ms * 1000.0 for r in requests]
    for i in sorted(range(len(requests)), key=lambda i: (arrival_us[i], i)):
        yield Req.of(i, requests[i], arrival_us[i])


def arrival_times(count: int | None, arrivals: Any, seed: int) -> Iterator[float] | None:
    """Arrival times (ms) of ``poisson`` and ``zero`` in input order (``count`` of them,
    None: endless); None for ``trace`` (each request keeps its own time)."""
    if arrivals.process == "zero":
        return _zeros(count)
    if arrivals.process == "trace":
        return None
    return _poisson(count, arrivals.rate_rps, seed)


def _zeros(count: int | None) -> Iterator[float]:
    n = 0
    while count is None or n < count:
        yield 0.0
        n += 1


def _poisson(count: int | None, rate_rps: float, seed: int) -> Iterator[float]:
    gaps = ExponentialSampler(random.Random(seed), rate_rps)
    t, n = 0.0, 0
    while count is None or n < count:
        t += gaps.draw() * 1000.0
        yield t
        n += 1


def as_reqs(rows: Iterable[tuple]) -> Iterator[Req]:
    """Arrival rows (``Req``'s arguments: index, rid, arrival (µs), prompt, max_new, L1
    and L2 hits, hashes) as Reqs. The lazy sources below give rows, so that a process that
    only draws them never builds a Req."""
    for i, rid, us, prompt, max_new, l1, l2, hashes in rows:
        yield Req(i, rid, us, prompt, max_new, l1, l2, hashes)


def drawn_in_order(
    rows: Iterable[tuple], times: Iterator[float] | None, speedup: float
) -> Iterator[tuple]:
    """Requests ``(rid, arrival_ms, prompt, max_new, l1, l2, hash_ids)`` read in input order
    whose arrival times never decrease in that order (so it is their arrival order): as
    arrival rows (:func:`as_reqs`), with ``times`` (None: each row's own time, divided by
    ``speedup``)."""
    if times is None:
        for i, (rid, ms, prompt, max_new, l1, l2, hashes) in enumerate(rows):
            if speedup != 1.0:
                ms = ms / speedup
            yield i, rid, ms * 1000.0, prompt, max_new, l1, l2, hashes
        return
    for i, ((rid, _, prompt, max_new, l1, l2, hashes), ms) in enumerate(
        zip(rows, times, strict=False)
    ):  # times: endless
        yield i, rid, ms * 1000.0, prompt, max_new, l1, l2, hashes


def synthetic_arrivals(
    spec: Any, default_max_new_tokens: int, arrivals: Any, seed: int
) -> Iterator[tuple]:
    """The ``synthetic`` source's requests (``spec``: ``admit.workload``, its seed set) as
    arrival rows (:func:`as_reqs`), drawn one at a time: the draws of :func:`cpkv.workload.synthetic.synthetic_draws`
    and the times of :func:`arrival_times` (the requests have no time of their own: with
    ``trace`` arrivals they all arrive at 0, in input order)."""
    from cpkv.workload.synthetic import synthetic_sampler

    draw_request = synthetic_sampler(spec)
    times = arrival_times(None, arrivals, seed)
    for k in range(spec.synthetic.count):
        a, b, e, mx = draw_request()
        max_new = default_max_new_tokens if mx is None else mx
        us = 0.0 if times is None else next(times) * 1000.0
        yield k, f"s{k}", us, a + b + e, max_new, a, b, None


def repeated_trace(
    requests: Sequence[Any], repeat: int, arrivals: Any, seed: int
) -> Iterator[tuple]:
    """``repeat`` copies of the trace ``requests`` (input order), copy ``c`` of request ``i``
    being request ``c * n + i`` (see :func:`copy_rows`), in arrival order, as arrival rows
    (:func:`as_reqs`)."""
    n = len(requests)
    times = arrival_times(None, arrivals, seed)
    if times is not None:  # poisson / zero: input order is arrival order
        yield from drawn_in_order(copy_rows(requests, repeat), times, 1.0)
        return
    period = trace_period(requests)
    speedup = arrivals.speedup
    base_order = sorted(range(n), key=lambda i: (requests[i].arrival_ms, i))
    last_us = -INF
    for c in range(repeat):
        shift = c * period
        ms = [r.arrival_ms + shift for r in requests]
        if speedup != 1.0:
            ms = [t / speedup for t in ms]
        us = [t * 1000.0 for t in ms]
        order = (
            base_order if _in_order(base_order, us) else sorted(range(n), key=lambda i: (us[i], i))
        )
        if us[order[0]] < last_us:
            raise ConfigError(
                f"admit.workload.repeat: copy {c} of the trace would start before copy {c - 1} "
                "ends (its times are too large for a float to keep them apart)"
            )
        last_us = us[order[-1]]
        offset = c * COPY_HASH_STRIDE
        for i in order:
            r = requests[i]
            rid, hashes = r.rid, r.hash_ids
            if c:
                rid = f"{rid}.{c}"
                if hashes is not None:
                    hashes = tuple([h + offset for h in hashes])
            yield (c * n + i, rid, us[i], r.prompt_tokens, r.max_new_tokens,
                   r.l1_cached_tokens, r.l2_cached_tokens, hashes)  # fmt: skip


def copy_rows(requests: Sequence[Any], repeat: int) -> Iterator[tuple]:
    """Every copy's requests in input order, as rows: copy ``c`` (from 0) of a request named
    ``rid`` is named ``rid.c`` (``rid`` itself in copy 0), arrives ``c`` periods later
    (:func:`trace_period`) and has block hashes ``h + c * 2**52`` (no prefix block shared
    with another copy)."""
    period = trace_period(requests)
    for c in range(repeat):
        shift, offset = c * period, c * COPY_HASH_STRIDE
        for r in requests:
            rid, hashes = r.rid, r.hash_ids
            if c:
                rid = f"{rid}.{c}"
                if hashes is not None:
                    hashes = tuple([h + offset for h in hashes])
            yield (rid, r.arrival_ms + shift, r.prompt_tokens, r.max_new_tokens,
                   r.l1_cached_tokens, r.l2_cached_tokens, hashes)  # fmt: skip


def trace_period(requests: Sequence[Any]) -> float:
    """How much later (ms) each copy of a repeated trace starts: the trace's span plus its
    mean gap between arrivals, ``(last - first) * n / (n - 1)``, so that the repeated trace
    keeps the trace's mean rate (0 for a single request or a trace whose requests all arrive
    at once: every copy then arrives at once too)."""
    n = len(requests)
    if n < 2:
        return 0.0
    times = [r.arrival_ms for r in requests]
    span = max(times) - min(times)
    return span + span / (n - 1)


def _in_order(order: list[int], us: list[float]) -> bool:
    """Whether ``order`` sorts ``us`` by (value, index)."""
    prev_t, prev_i = -INF, -1
    for i in order:
        t = us[i]
        if t < prev_t or (t == prev_t and i < prev_i):
            return False
        prev_t, prev_i = t, i
    return True
