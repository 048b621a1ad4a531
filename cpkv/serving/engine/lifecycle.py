"""What happens to requests outside the scheduler's plan, in a run with policy options:
queue timeouts, client cancellations, swap preemption, and the requests' policy state.

The engine calls :class:`Lifecycle` at a few points:

* ``arrived(r)`` when a request joins the queue: its
  :class:`~cpkv.serving.schedulers.options.RequestPolicy` (priority, deadline, cancel
  time, queue-entry time);
* ``horizon()``: the next time a cancellation or a timeout falls due (the engine runs no
  iteration past it without a look: closed-form stretches stop there);
* ``before_iteration()`` at each iteration boundary: cancellations that are due (wherever
  the request is: it stops and frees everything), then queue timeouts (a request that has
  waited ``queue_timeout_ms`` since it last entered the queue leaves it);
* ``admitted(r, loaded)`` when a request leaves the queue, ``preempted(r, kv)`` when the
  scheduler preempts a running request for a waiting one, ``before_duration()`` once the
  iteration's work is known (swap-out traffic, those victims back to the queue),
  ``requeued(r)`` for a growth victim going back to the queue.

Terminal states: ``timed_out`` (reason ``waiting``) and ``cancelled`` (reason: where it was,
``waiting``, ``prefilling`` or ``running``).

Modelling choices:

* a cancel time (JSONL ``cancel_ms``) and a deadline (JSONL ``deadline_ms``) are relative
  to the request's arrival; the engine notices both at iteration boundaries, as a
  scheduler does;
* swap (``admit.serving.on_preempt: swap``): a victim's KV (its prompt minus its L1 prefix,
  plus its output) is copied to host memory in the iteration that preempts it and copied
  back when it is admitted again, each way as load-back traffic (``admit.cost``'s load
  bandwidth, counted in the iteration's time); nothing is recomputed, unless the copy is
  smaller than ``load_back_threshold`` (then it is recomputed, as an L2 hit that small
  would be);
* the safety margin is device memory no request may take (workspace, CUDA graphs): the
  pool starts with ``safety_margin_blocks`` fewer free blocks, counted as held.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from cpkv.serving.model.request import (
    CANCELLED,
    LIVE,
    RUNNING,
    TIMED_OUT,
    WAITING,
    Req,
)
from cpkv.serving.schedulers.options import PolicyOptions, RequestPolicy

INF = float("inf")


@dataclass
class PolicyCounts:
    """What happened to requests outside the plans (the run's summary reads them)."""

    timed_out: int = 0
    cancelled: dict[str, int] = field(default_factory=dict)
    priority_preemptions: int = 0
    swap_out_tokens: int = 0
    swap_in_tokens: int = 0


class Lifecycle:
    """The request lifecycle of one engine with policy options (module docstring)."""

    def __init__(self, engine: Any, opts: PolicyOptions) -> None:
        self.engine, self.opts = engine, opts
        self.counts = PolicyCounts()
        self.slo_us = None if opts.slo_ttft_ms is None else opts.slo_ttft_ms * 1000.0
        self.timeout_us = None if opts.queue_timeout_ms is None else opts.queue_timeout_ms * 1000.0
        self.cancels: list[tuple[float, int, Req]] = []
        self.timeouts: list[tuple[float, int, Req]] = []
        self.pending_requeue: list[Req] = []

    # -- arrivals and the clock -----------------------------------------------------------
    def arrived(self, r: Req) -> None:
        """``r`` joins the queue for the first time."""
        arrival = r.arrival_us
        if r.deadline_ms is None and self.slo_us is not None:
            deadline_us = arrival + self.slo_us
        else:
            deadline_us = INF if r.deadline_ms is None else arrival + r.deadline_ms * 1000.0
        cancel_us = INF if r.cancel_ms is None else arrival + r.cancel_ms * 1000.0
        r.policy = RequestPolicy(self.engine.now, deadline_us, cancel_us)
        if cancel_us < INF:
            heapq.heappush(self.cancels, (cancel_us, r.index, r))
        self._watch_timeout(r)

    def _watch_timeout(self, r: Req) -> None:
        if self.timeout_us is not None:
            heapq.heappush(self.timeouts, (r.policy.queue_entry_us + self.timeout_us, r.index, r))

    def horizon(self) -> float:
        """When the next cancellation or queue timeout falls due (inf: none)."""
        cancels, timeouts = self.cancels, self.timeouts
        while cancels and cancels[0][2].state not in LIVE:
            heapq.heappop(cancels)
        while timeouts and not self._times_out(*timeouts[0]):
            heapq.heappop(timeouts)
        first = cancels[0][0] if cancels else INF
        return min(first, timeouts[0][0]) if timeouts else first

    def _times_out(self, expiry: float, _index: int, r: Req) -> bool:
        return r.state == WAITING and r.policy.queue_entry_us + self.timeout_us == expiry

    def before_iteration(self) -> None:
        """Cancellations and timeouts that are due at the engine's time."""
        now = self.engine.now
        cancels = self.cancels
        while cancels and cancels[0][0] <= now:
            _, _, r = heapq.heappop(cancels)
            if r.state in LIVE:
                self.cancel(r)
        timeouts = self.timeouts
        while timeouts and timeouts[0][0] <= now:
            entry = heapq.heappop(timeouts)
            if self._times_out(*entry):
                self.time_out(entry[2])

    def cancel(self, r: Req) -> None:
        """The client cancelled ``r``: it stops wherever it is and frees everything."""
        engine, pool = self.engine, self.engine.pool
        if r.state == WAITING:
            where = "waiting"
            engine.waiting.remove(r)
        elif r.state == RUNNING:
            where = "running"
            pool.leave(r)
        else:  # PREFILL: admitted, prompt not complete
            where = "prefilling"
            if engine.lane is not None:
                engine.lane.leave(r)  # (its chunks so far written out)
            engine.prefilling.remove(r)
            pool.release_prefill(r)
        r.policy.swapped_tokens = 0  # a host copy is dropped
        r.state, r.reject_reason, r.finished_us = CANCELLED, where, engine.now
        cancelled = self.counts.cancelled
        cancelled[where] = cancelled.get(where, 0) + 1
        engine.ended(r)

    def time_out(self, r: Req) -> None:
        """``r`` waited too long: it leaves the queue (it holds no KV while waiting)."""
        engine = self.engine
        engine.waiting.remove(r)
        r.policy.swapped_tokens = 0
        r.state, r.reject_reason, r.finished_us = TIMED_OUT, "waiting", engine.now
        self.counts.timed_out += 1
        engine.ended(r)

    # -- admission and preemption ----------------------------------------------------------
    def hit(self, r: Req, plain: Any) -> tuple[int, int]:
        """``r``'s hits: a swapped-out request's host copy, else ``plain(r)``."""
        policy = r.policy
        if policy is not None and policy.swapped_tokens:
            return policy.swap_device, policy.swapped_tokens
        return plain(r)

    def admitted(self, r: Req, loaded: int) -> None:
        """``r`` left the queue (``loaded``: its L2 hit loaded back)."""
        policy = r.policy
        if policy.swapped_tokens:
            if loaded >= policy.swapped_tokens:
                self.counts.swap_in_tokens += policy.swapped_tokens
            else:  # below the load-back threshold: recomputed after all
                r.recomputed += policy.swapped_tokens
            policy.swapped_tokens = 0

    def preempted(self, victim: Req, kv: int) -> None:
        """The scheduler preempted ``victim`` (which held ``kv`` tokens) for a waiting
        request: its KV is swapped or discarded; it re-enters the queue after this
        iteration's admission."""
        victim.preemptions += 1
        victim.state = WAITING
        if self.opts.swap:
            self._swap_out(victim, kv)
        else:
            victim.recomputed += kv
        victim.fill_tokens = victim.prompt_tokens + victim.generated
        victim.filled_tokens = victim.device_prefix = victim.host_hit = victim.kv_tokens = 0
        self.pending_requeue.append(victim)
        self.counts.priority_preemptions += 1
        counts = self.engine.counters["preemptions"]
        counts["priority"] = counts.get("priority", 0) + 1

    def before_duration(self) -> None:
        """Swap-out traffic of this iteration's growth victims; the scheduler's victims
        re-enter the queue."""
        engine = self.engine
        if self.opts.swap:
            for r, _phase in engine.pool.preempted:
                if r.state == WAITING and not r.policy.swapped_tokens:
                    kv = r.prompt_tokens + engine.pool.gen_now(r) - r.device_prefix
                    r.recomputed -= kv
                    self._swap_out(r, kv)
        if self.pending_requeue:
            for r in self.pending_requeue:
                self.requeued(r)
                engine.waiting.append(r)
            self.pending_requeue = []

    def _swap_out(self, r: Req, kv: int) -> None:
        if kv <= 0:
            return
        engine = self.engine
        r.policy.swapped_tokens, r.policy.swap_device = kv, r.device_prefix
        self.counts.swap_out_tokens += kv
        engine.loaded += kv  # the copy takes load bandwidth in this iteration
        engine.counters["loaded_tokens"] -= kv  # ... but it is no L2 hit

    def requeued(self, r: Req) -> None:
        """A preempted request enters the queue again."""
        policy = r.policy
        policy.queue_entry_us = self.engine.now
        policy.arrival_processed_tokens = None
        self._watch_timeout(r)
