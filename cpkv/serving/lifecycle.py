"""cpkv's admission-policy space inside the serving loop (issue 13): queue orders, priority
preemption, the ``profiled`` reservation, weighted and slot budgets, the safety margin,
swap preemption, queue timeouts and client cancellation.

A run whose policy keys are all defaults has no :class:`Lifecycle` (``SimSettings.extra``
is None) and runs exactly as before; otherwise the loop calls it at a few delimited points
(each marked ``# issue 13`` in :mod:`cpkv.serving.loop`):

* ``arrived(r)`` when a request joins the queue: its priority, deadline, cancel time and
  queue-entry time;
* ``until(t)`` caps how far a decode-only stretch may run: to the next cancellation (and
  to now when invariants are checked, so that every iteration takes the full path);
* ``before_iteration()`` at each iteration boundary: cancellations that are due
  (wherever the request is: it stops and frees everything), then queue timeouts (a
  request that has waited ``queue_timeout_ms`` since it last entered the queue leaves it);
* ``before_admission(decoded)`` after the decode step: the queue is ordered (SGLang's
  ``calc_priority`` through :class:`~cpkv.admission.schedule_policy.WaitingQueueOrder`, or
  cpkv's :func:`~cpkv.policies.deadline.deadline_sort`), then, with priority preemption,
  running requests are preempted for more urgent waiting ones
  (:func:`~cpkv.admission.schedule_policy.choose_preemption`);
* ``admitted(r, loaded)`` in ``Sim.admit``, ``before_duration()`` once the iteration's
  work is known (swap-out traffic, priority victims back to the queue), ``requeued(r)``
  for a growth victim going back to the queue, ``done(r)`` when a request ends, and
  ``after_iteration(decoded)`` (the invariants, :mod:`cpkv.serving.invariants`).

Terminal states: ``finished``, ``rejected``, ``timed_out`` (reason ``waiting``) and
``cancelled`` (reason: where it was, ``waiting``, ``prefilling`` or ``running``).

Modelling choices where the issue is silent:

* a cancel time (JSONL ``cancel_ms``) and a deadline (JSONL ``deadline_ms``) are relative
  to the request's arrival; the loop notices both at iteration boundaries, as a scheduler
  does;
* swap (``admit.serving.on_preempt: swap``): a victim's KV (its prompt minus its L1 prefix,
  plus its output) is copied to host memory in the iteration that preempts it and copied
  back when it is admitted again, each way as load-back traffic (``admit.cost``'s load
  bandwidth, counted in the iteration's time); nothing is recomputed, unless the copy is
  smaller than ``load_back_threshold`` (then it is recomputed, as an L2 hit that small
  would be);
* priority preemption runs before the PrefillAdder pass, for the queue's head requests
  while the running set is at ``max_running_requests`` (SGLang calls it inside its scan,
  on the same condition); its victims re-enter the queue after the pass and are counted
  as preemptions with reason ``priority``. The candidate's need counts its real fill and
  device prefix (SGLang's first examination counts neither, a caveat of
  :mod:`cpkv.admission.schedule_policy.preempt`);
* cache-aware orders match requests with the loop's hits (page aligned, capped below the
  prompt: :class:`~cpkv.serving.hits.PrefixHits`), ``dfs-weight`` breaks ties between
  equally heavy subtrees by first appearance in the queue;
* the safety margin is device memory no request may take (workspace, CUDA graphs): the
  pool starts with ``safety_margin_blocks`` fewer free blocks, counted as held;
* ``max_running_requests`` with the block policies counts running and prefilling requests.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from cpkv.admission.schedule_policy import (
    RunningState,
    SchedulePolicyConfig,
    WaitingQueueOrder,
    choose_preemption,
    preemption_need_tokens,
)
from cpkv.policies.budgets import TokenWeights, weighted_prefill_budget
from cpkv.policies.deadline import deadline_sort
from cpkv.policies.profiled import OutputQuantile
from cpkv.serving.kv_pool import (
    CANCELLED,
    FINISHED,
    PREFILL,
    RUNNING,
    TIMED_OUT,
    WAITING,
    Req,
)
from cpkv.serving.policy_options import PolicyOptions

INF = float("inf")


class ReqPolicy:
    """A request's policy state (``Req.ext``, set when it arrives)."""

    __slots__ = (
        "priority", "queue_entry_us", "deadline_us", "cancel_us", "arrival_processed_tokens",
        "swapped_tokens", "swap_device", "reserved_output_tokens", "reserved_blocks",
    )  # fmt: skip

    def __init__(self, priority: int, entry_us: float, deadline_us: float, cancel_us: float):
        self.priority, self.queue_entry_us = priority, entry_us
        self.deadline_us, self.cancel_us = deadline_us, cancel_us
        self.arrival_processed_tokens: int | None = None
        self.swapped_tokens = self.swap_device = 0
        self.reserved_output_tokens = -1  # profiled: output tokens reserved at admission
        self.reserved_blocks = 0  # profiled: blocks the reservation covers


@dataclass
class PolicyCounts:
    """What the policy machinery counted (the run's summary reads them)."""

    timed_out: int = 0
    cancelled: dict[str, int] = field(default_factory=dict)
    priority_preemptions: int = 0
    swap_out_tokens: int = 0
    swap_in_tokens: int = 0
    reservation_exceeded: int = 0
    profiled_finished: int = 0
    invariant_checks: int = 0


class Lifecycle:
    """The policy machinery of one :class:`~cpkv.serving.loop.Sim` (module docstring)."""

    def __init__(self, sim: Any, opts: PolicyOptions) -> None:
        self.sim, self.opts = sim, opts
        self.counts = PolicyCounts()
        schedule = opts.schedule
        self.order = None
        if schedule != SchedulePolicyConfig() and (
            schedule.schedule_policy != "fcfs" or schedule.enable_priority_scheduling
        ):
            self.order = WaitingQueueOrder(schedule, block_size=sim.block_size, seed=opts.seed)
        self.priority_preempt = schedule.priority_preemption
        self.low_first = schedule.schedule_low_priority_values_first
        self.aging_us = None if opts.deadline_aging_ms is None else opts.deadline_aging_ms * 1000.0
        self.slo_us = None if opts.slo_ttft_ms is None else opts.slo_ttft_ms * 1000.0
        self.estimator = OutputQuantile(opts.profiled) if opts.profiled is not None else None
        self.timeout_us = None if opts.queue_timeout_ms is None else opts.queue_timeout_ms * 1000.0
        self.cancels: list[tuple[float, int, Req]] = []
        self.timeouts: list[tuple[float, int, Req]] = []
        self.pending_requeue: list[Req] = []
        self.weighted = opts.weights != TokenWeights() or opts.verify_tokens
        self.ended: set[int] = set()  # with check_invariants: requests that ended
        self.decoded = 0
        # the pool: a safety margin no request may take
        margin = opts.safety_margin_blocks
        if margin:
            sim.pool.free_blocks -= margin
            sim._never_blocks -= margin
            if sim._never_tokens is not None:
                sim._never_tokens -= margin * sim.block_size
        if opts.swap:
            plain = sim.hit

            def hit(r: Req) -> tuple[int, int]:
                ext = r.ext
                if ext.swapped_tokens:
                    return ext.swap_device, ext.swapped_tokens
                return plain(r)

            sim.hit = hit
        if opts.check_invariants:
            from cpkv.serving.invariants import Invariants

            self.invariants: Any = Invariants(sim, self)
            sim.lone_fast = False
        else:
            self.invariants = None

    # -- arrivals and the clock -----------------------------------------------------------
    def arrived(self, r: Req) -> None:
        """``r`` joins the queue for the first time."""
        given = getattr(r, "ext", None)  # the ServingRequest, for requests built from one
        priority = getattr(given, "priority", None)
        deadline_ms = getattr(given, "deadline_ms", None)
        cancel_ms = getattr(given, "cancel_ms", None)
        arrival = r.arrival_us
        if deadline_ms is None and self.slo_us is not None:
            deadline_us = arrival + self.slo_us
        else:
            deadline_us = INF if deadline_ms is None else arrival + deadline_ms * 1000.0
        cancel_us = INF if cancel_ms is None else arrival + cancel_ms * 1000.0
        ext = r.ext = ReqPolicy(
            0 if priority is None else priority, self.sim.now, deadline_us, cancel_us
        )
        if cancel_us < INF:
            heapq.heappush(self.cancels, (cancel_us, r.index, r))
        if self.timeout_us is not None:
            heapq.heappush(self.timeouts, (ext.queue_entry_us + self.timeout_us, r.index, r))

    def until(self, until_us: float) -> float:
        """How far a decode-only stretch may run (see the module docstring)."""
        if self.invariants is not None:
            return self.sim.now
        cancels = self.cancels
        while cancels and cancels[0][2].state not in (WAITING, PREFILL, RUNNING):
            heapq.heappop(cancels)
        return min(until_us, cancels[0][0]) if cancels else until_us

    def before_iteration(self) -> None:
        """Cancellations and timeouts that are due at ``sim.now``."""
        sim = self.sim
        now = sim.now
        cancels = self.cancels
        while cancels and cancels[0][0] <= now:
            _, _, r = heapq.heappop(cancels)
            if r.state in (WAITING, PREFILL, RUNNING):
                self.cancel(r)
        timeouts = self.timeouts
        while timeouts and timeouts[0][0] <= now:
            expiry, _, r = heapq.heappop(timeouts)
            if r.state == WAITING and r.ext.queue_entry_us + self.timeout_us == expiry:
                self.time_out(r)

    def cancel(self, r: Req) -> None:
        """The client cancelled ``r``: it stops wherever it is and frees everything."""
        sim, pool = self.sim, self.sim.pool
        if r.state == WAITING:
            where = "waiting"
            sim.waiting.remove(r)
        elif r.state == RUNNING:
            where = "running"
            pool.leave(r)
        else:  # PREFILL: admitted, prompt not complete
            where = "prefilling"
            if sim.chunked is r:
                sim.chunked = None
            else:
                sim.prefilling.remove(r)
            pool.release_prefill(r)
        r.ext.swapped_tokens = 0  # a host copy is dropped
        r.state, r.reject_reason, r.finished_us = CANCELLED, where, sim.now
        cancelled = self.counts.cancelled
        cancelled[where] = cancelled.get(where, 0) + 1
        sim._done(r)

    def time_out(self, r: Req) -> None:
        """``r`` waited too long: it leaves the queue (it holds no KV while waiting)."""
        sim = self.sim
        sim.waiting.remove(r)
        r.ext.swapped_tokens = 0
        r.state, r.reject_reason, r.finished_us = TIMED_OUT, "waiting", sim.now
        self.counts.timed_out += 1
        sim._done(r)

    # -- admission ------------------------------------------------------------------------
    def before_admission(self, decoded: int) -> None:
        """Order the queue, then priority preemption (see the module docstring)."""
        sim = self.sim
        self.decoded = decoded
        waiting = sim.waiting
        if len(waiting) > 1:
            if self.aging_us is not None:
                deadline_sort(waiting, sim.now, self.aging_us)
                sim.scan_free = -1  # the block policies' scans start over
            elif self.order is not None:
                processed = sim.counters["prefill_tokens"]
                for r in waiting:
                    if r.ext.arrival_processed_tokens is None:
                        r.ext.arrival_processed_tokens = processed
                self.order.sort(waiting, sim.hit, processed)
        if self.priority_preempt and waiting:
            self._preempt_for_priority(decoded)

    def _preempt_for_priority(self, decoded: int) -> None:
        sim = self.sim
        pool, limit = sim.pool, sim.settings.adder.max_running_requests
        if limit is None:
            return  # the batch is never full: SGLang never preempts for priority
        schedule = self.opts.schedule
        for candidate in list(sim.waiting):
            if pool.n_running + (sim.chunked is not None) < limit:
                break
            running = pool.running_reqs()
            states = [
                RunningState(
                    r.ext.priority, r.ext.queue_entry_us, r.max_new_tokens, pool.gen_now(r)
                )
                for r in running
            ]
            device, _host = sim.hit(candidate)
            need = preemption_need_tokens(candidate.fill_tokens, device, candidate.max_new_tokens)
            rem_total = (
                pool.free_blocks * sim.block_size
                - decoded
                - pool.headroom_tokens() * sim.ratio.current
            )
            chosen = choose_preemption(
                candidate.ext.priority, need, rem_total, states, sim.ratio.current,
                schedule.priority_scheduling_preemption_threshold, self.low_first,
            )  # fmt: skip
            if chosen is None:
                break
            for i in chosen.victims:
                victim = running[i]
                kv = pool.leave(victim)
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
                counts = sim.counters["preemptions"]
                counts["priority"] = counts.get("priority", 0) + 1

    def prefill_budget(self, decoded: int) -> int:
        """Block policies: prefill tokens this iteration may carry."""
        sim = self.sim
        if not self.weighted:
            return sim.budget_tokens - decoded
        o = self.opts
        return weighted_prefill_budget(sim.budget_tokens, decoded, o.verify_tokens, o.weights)

    def slots_full(self) -> bool:
        """Block policies: ``max_running_requests`` reached (running and prefilling)."""
        limit = self.opts.max_running_requests
        sim = self.sim
        return limit is not None and sim.pool.n_running + len(sim.prefilling) >= limit

    def kv_stop(self, need_tokens: int) -> str:
        """The stop reason of a request whose ``need_tokens`` do not fit the free blocks:
        ``safety_margin_blocks`` when they would fit without the margin, else ``kv_blocks``."""
        sim = self.sim
        need = -(-need_tokens // sim.block_size)
        margin = self.opts.safety_margin_blocks
        return (
            "safety_margin_blocks"
            if margin and need <= sim.pool.free_blocks + margin
            else "kv_blocks"
        )

    def profiled_scan(self) -> None:
        """Policy ``profiled``: admit each waiting request (in queue order; ``admit.kv.scan``)
        whose prompt blocks plus reserved output fit the free blocks left after every admitted
        request's outstanding reservation."""
        sim = self.sim
        pool, block, est = sim.pool, sim.block_size, self.estimator
        outstanding = 0
        for r in [*pool.running_reqs(), *sim.prefilling]:
            held = -(-pool.kv_now(r) // block)
            if r.ext.reserved_blocks > held:
                outstanding += r.ext.reserved_blocks - held
        waiting, kept = sim.waiting, []
        stop = None
        for k, r in enumerate(waiting):
            if self.slots_full():
                stop = "max_running_requests"
                kept.extend(waiting[k:])
                break
            device, host = sim.hit(r)
            out = est.reserve(r.max_new_tokens - r.generated)
            kv = r.fill_tokens - device
            need = -(-(kv + out) // block)
            if need + outstanding <= pool.free_blocks:
                sim.admit(r, device, host, None)
                r.ext.reserved_output_tokens = r.generated + out
                r.ext.reserved_blocks = need
                outstanding += need - -(-kv // block)
                sim.prefilling.append(r)
                continue
            stop = self.kv_stop(kv + out + (outstanding * block))
            kept.append(r)
            if sim.scan == "fcfs_stop":
                kept.extend(waiting[k + 1 :])
                break
        waiting[:] = kept
        if stop is not None:
            sim.stop_counts[stop] = sim.stop_counts.get(stop, 0) + 1

    def admitted(self, r: Req, loaded: int) -> None:
        """``Sim.admit`` took ``r`` (``loaded``: its L2 hit loaded back)."""
        ext = r.ext
        if self.invariants is not None:
            self.invariants.admitting(r)
        if ext.swapped_tokens:
            if loaded >= ext.swapped_tokens:
                self.counts.swap_in_tokens += ext.swapped_tokens
            else:  # below the load-back threshold: recomputed after all
                r.recomputed += ext.swapped_tokens
            ext.swapped_tokens = 0

    # -- the iteration's end --------------------------------------------------------------
    def before_duration(self) -> None:
        """Swap-out traffic of this iteration's growth victims; priority victims re-enter the
        queue."""
        sim = self.sim
        if self.opts.swap:
            for r, _phase in sim.pool.preempted:
                if r.state == WAITING and not r.ext.swapped_tokens:
                    kv = r.prompt_tokens + sim.pool.gen_now(r) - r.device_prefix
                    r.recomputed -= kv
                    self._swap_out(r, kv)
        if self.pending_requeue:
            for r in self.pending_requeue:
                self.requeued(r)
                sim.waiting.append(r)
            self.pending_requeue = []

    def _swap_out(self, r: Req, kv: int) -> None:
        if kv <= 0:
            return
        sim = self.sim
        r.ext.swapped_tokens, r.ext.swap_device = kv, r.device_prefix
        self.counts.swap_out_tokens += kv
        sim.loaded += kv  # the copy takes load bandwidth in this iteration
        sim.counters["loaded_tokens"] -= kv  # ... but it is no L2 hit

    def requeued(self, r: Req) -> None:
        """A preempted request enters the queue again."""
        ext = r.ext
        ext.queue_entry_us = self.sim.now
        ext.arrival_processed_tokens = None
        if self.timeout_us is not None:
            heapq.heappush(self.timeouts, (ext.queue_entry_us + self.timeout_us, r.index, r))

    def done(self, r: Req) -> None:
        """``r`` ended (any terminal state)."""
        if self.invariants is not None:
            self.ended.add(r.index)
            self.invariants.finished(r)
        if r.state != FINISHED or self.estimator is None:
            return
        ext = getattr(r, "ext", None)
        self.counts.profiled_finished += 1
        if ext is not None and 0 <= ext.reserved_output_tokens < r.generated:
            self.counts.reservation_exceeded += 1
        self.estimator.observe(r.generated)

    def after_iteration(self) -> None:
        if self.invariants is not None:
            self.invariants.check(self.decoded)
            self.counts.invariant_checks += 1
