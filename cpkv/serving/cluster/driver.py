"""The cluster driver: ``admit.cluster.instances`` serving instances behind a router.

Each instance is one :class:`~cpkv.serving.engine.engine.Engine` with its own KV pool, L1 prefix cache and
L2 (or one L2 shared by all, :func:`shared_l2_caches`), or one
:class:`~cpkv.serving.engine.vllm_engine.VllmEngine` (``admit.engine: vllm``: its pool and prefix
cache its own), fed by :meth:`~cpkv.serving.engine.engine.Engine.deliver`. The driver reads the run's requests in arrival order; for each it first advances
every instance to the arrival time (:meth:`~cpkv.serving.engine.engine.Engine.advance`: every iteration
that starts before it), then asks the router (:mod:`cpkv.serving.cluster.routers`) where the
request goes, from what a real router knows at that moment, and delivers it there. A
request delivered at ``t`` joins its instance's queue at the first iteration that starts at
or after ``t``, as in a run that reads its own arrivals: one instance behind any router is
the plain run, request for request and float for float.

What the router sees, per instance (:class:`~cpkv.serving.cluster.routers.InstanceLoad`), at
arrival time ``t``:

* outstanding requests: routed there and not ended by ``t`` (sgl-router counts the requests it
  forwarded and has not seen answered). An instance's last iteration may end after ``t``; a
  request it finishes then is still outstanding at ``t``;
* of those, ``queued``: delivered and not yet in the engine, or waiting in its queue (a
  preempted request waiting again counts); the rest are ``running``;
* tokens (``least_tokens`` only, the others never read them): each outstanding request's
  prompt plus the tokens it generated so far, split the same way.

Per instance the driver keeps the requests' latencies and goodput
(:class:`~cpkv.serving.record.requests.RequestStats` over the requests it served), their L1 and L2
hit tokens, and the time its iterations took (its *work*); in total, the requests of all
instances in input order (``requests.jsonl``, each line with its ``instance`` when there is
more than one). The load imbalance is max / mean of the instances' work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import numpy as np

from cpkv.serving.cluster.routers import (
    InstanceLoad,
    RoutedRequest,
    RouterStats,
    make_router,
    unique_blocks,
)
from cpkv.serving.model.request import FINISHED, PENDING, RUNNING, WAITING, Req
from cpkv.serving.record.lines import integer_column, text_column
from cpkv.serving.record.requests import RequestStats

INF: Final = float("inf")
NEEDS_TOKENS = frozenset({"least_tokens"})
"""Routers that read the instances' tokens (the others read request counts only)."""
NEEDS_PREFIX = frozenset({"prefix_aware"})
"""Routers that read the request's prefix blocks."""


class Tally(Protocol):
    """What the driver reads and counts of an instance's requests (:class:`InstanceTally`, a
    prefill instance's :class:`~cpkv.serving.cluster.disagg.tallies.PrefillTally`)."""

    routed: int
    ended: int
    live: dict[int, tuple[Req, int]]
    late: list[Req]
    routing_us: float

    def gone_us(self, r: Req) -> float:
        """When ``r`` stopped being outstanding on the instance."""

    def taken(self, r: Req) -> bool:
        """Whether the instance took ``r`` delivered to it into its queue."""


@dataclass
class InstanceTally:
    """One instance's requests as they end (the sink its engine reports to)."""

    instance: int
    total: RequestStats
    own: RequestStats
    routed: int = 0
    ended: int = 0
    prompt_tokens: int = 0  # of the requests admitted (their first admission's hits below)
    l1_hit_tokens: int = 0
    l2_hit_tokens: int = 0
    live: dict[int, tuple[Req, int]] = field(default_factory=dict)  # index: (request, number)
    late: list[Req] = field(default_factory=list)  # ended after the routing time
    routing_us: float = -INF  # the time of the arrival being routed
    on_done: Callable[[Req], Any] | None = None  # the trace's request slices

    @staticmethod
    def gone_us(r: Req) -> float:
        """When ``r`` stopped being outstanding here: its end."""
        return r.finished_us

    @staticmethod
    def taken(r: Req) -> bool:
        """Whether the instance took ``r`` delivered to it into its queue."""
        return r.state != PENDING

    def done(self, r: Req) -> None:
        _, number = self.live.pop(r.index)
        self.total.done(r)
        self.own.done(r, number)  # (numbered in the order it was routed here)
        self.ended += 1
        if r.finished_us > self.routing_us:
            self.late.append(r)
        if r.l1_hit is not None:
            self.prompt_tokens += r.prompt_tokens
            self.l1_hit_tokens += r.l1_hit
            self.l2_hit_tokens += r.l2_hit
        if self.on_done is not None:
            self.on_done(r)


@dataclass
class ClusterRun:
    """What :func:`run_cluster` returns: per instance its :class:`SimResult` and tally, the
    router's decision counts, the instance of every request (input order) and the end."""

    results: list[Any]
    tallies: list[Tally]
    router: RouterStats
    instance_of: list[int]
    end_us: float


class Cluster:
    """Instances behind a router (see the module docstring)."""

    def __init__(
        self,
        sims: Sequence[Any],
        tallies: Sequence[Tally],
        router_name: str,
        settings: Any,
        seed: int,
        block_tokens: int,
    ) -> None:
        self.sims, self.tallies = list(sims), list(tallies)
        n = len(self.sims)
        self.router = make_router(router_name, settings, n, seed)
        self.stats = RouterStats(n)
        self.needs_tokens = router_name in NEEDS_TOKENS
        self.needs_prefix = router_name in NEEDS_PREFIX
        self.block_tokens = block_tokens
        self.pending: list[deque[Req]] = [deque() for _ in range(n)]  # delivered, not in the engine
        self.instance_of: list[int] = []
        self.now_us = -INF

    def route(self, r: Req) -> int:
        """Advance every instance to ``r``'s arrival, route it, deliver it; its instance."""
        chosen = self.place(r, r.arrival_us)
        self.sims[chosen].deliver(r)
        return chosen

    def place(self, r: Req, t: float) -> int:
        """Advance every instance to ``t``, route ``r`` from the loads then and count it on
        its instance (delivered later, by the caller); its instance."""
        if t > self.now_us:
            for sim in self.sims:
                sim.advance(t)
            self.now_us = t
            for tally in self.tallies:
                tally.routing_us = t
        if len(self.sims) == 1:
            chosen = 0
            self.stats.per_instance[0] += 1
            self._forget(t)  # no loads to read: only what they would hold goes
        else:
            decision = self.router.route(self._request(r), self.loads(t), t / 1000.0)
            self.stats.record(decision)
            chosen = decision.instance
        tally = self.tallies[chosen]
        tally.live[r.index] = (r, tally.routed)
        tally.routed += 1
        self.pending[chosen].append(r)
        index = r.index
        if index >= len(self.instance_of):
            self.instance_of.extend([-1] * (index + 1 - len(self.instance_of)))
        self.instance_of[index] = chosen
        return chosen

    def _request(self, r: Req) -> RoutedRequest:
        if not self.needs_prefix:
            return RoutedRequest(r.rid, r.prompt_tokens, r.max_new_tokens)
        hashes = r.hash_ids
        blocks = (
            unique_blocks(r.rid, r.prompt_tokens, self.block_tokens)
            if hashes is None
            else tuple(hashes)
        )
        return RoutedRequest(r.rid, r.prompt_tokens, r.max_new_tokens, blocks, self.block_tokens)

    def _forget(self, t: float) -> None:
        """Drop the requests the loads at ``t`` no longer count: those that ended by ``t``
        (``late``), those delivered that the engines took (``pending``); what a run holds
        stays bounded by the requests in flight."""
        for tally, pending in zip(self.tallies, self.pending, strict=True):
            late = tally.late
            if late:
                gone = tally.gone_us
                late[:] = [r for r in late if gone(r) > t]
            while pending and tally.taken(pending[0]):
                pending.popleft()

    def loads(self, t: float) -> list[InstanceLoad]:
        """Every instance's load at ``t`` (see the module docstring)."""
        self._forget(t)
        out = []
        for sim, tally, pending in zip(self.sims, self.tallies, self.pending, strict=True):
            late = tally.late
            outstanding = tally.routed - tally.ended + len(late)
            built = sim.built.queue if getattr(sim, "built", None) is not None else ()
            queued = min(outstanding, len(pending) + len(sim.waiting) + len(built))
            if not self.needs_tokens:
                out.append(InstanceLoad(queued, outstanding - queued))
                continue
            queued_tokens = running_tokens = 0
            gen_now = _generated_now(sim)
            # an iteration in flight at t (it ends after t) has not emitted its tokens yet:
            # every request running at its end generated one token in it
            unseen = 1 if sim.now > t else 0
            for r, _ in tally.live.values():
                state = r.state
                if state == PENDING or state == WAITING:
                    queued_tokens += r.prompt_tokens + r.generated
                elif state == RUNNING:
                    running_tokens += r.prompt_tokens + gen_now(r) - unseen
                else:
                    running_tokens += r.prompt_tokens + r.generated
            for r in late:  # they generated their last token after t
                running_tokens += r.prompt_tokens + r.generated - (r.state == FINISHED)
            out.append(InstanceLoad(queued, outstanding - queued, queued_tokens, running_tokens))
        return out

    def run(self, arriving: Iterable[Req]) -> ClusterRun:
        """Route every request, run the instances to the end, close them."""
        for r in arriving:
            self.route(r)
        for sim in self.sims:
            sim.advance(INF)
        results = [sim.close() for sim in self.sims]
        end = max(res.end_us for res in results)
        return ClusterRun(results, self.tallies, self.stats, self.instance_of, end)


def _generated_now(sim: Any) -> Callable[[Req], int]:
    """The tokens a running request of ``sim`` generated by its last iteration's end: cpkv's
    engine derives them from its pool's step counter, SGLang's loop asks its model, the vLLM
    engine counts them."""
    pool = getattr(sim, "pool", None)
    if pool is not None:
        return pool.gen_now
    return getattr(sim, "generated_now", _generated)


def _generated(r: Req) -> int:
    return r.generated


def shared_l2_caches(caches: Sequence[Any], l2_tokens: int | None) -> None:
    """Make the instances' tiered caches share one L2 tier of ``l2_tokens`` (None:
    unlimited): each keeps its own L1; the shared L2 never evicts a block that any L1 holds,
    so every L1 stays inside it."""
    from cpkv.trace.prefix_cache import _Tier

    if not caches or caches[0].l2 is None:
        return
    shared = _Tier(l2_tokens)
    pinned = AnyOf([c.l1.blocks for c in caches])
    for cache in caches:
        cache.l2 = shared
        cache.l2_pinned = pinned


class AnyOf:
    """The union of some dicts' keys, for ``in`` (the L1 blocks of every instance)."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[dict]) -> None:
        self.parts = list(parts)

    def __contains__(self, key: object) -> bool:
        return any(key in part for part in self.parts)


class InstanceColumns:
    """The ``columns`` of the total :class:`RequestStats` that end each line with its
    ``instance``."""

    def __init__(self, instance_of: Sequence[int]) -> None:
        self.instance_of = instance_of

    def __call__(self, first: int, n: int) -> list[np.ndarray]:
        instances = np.array(self.instance_of[first : first + n], dtype=np.int64)
        return [text_column(',"instance":', n), integer_column(instances)]
