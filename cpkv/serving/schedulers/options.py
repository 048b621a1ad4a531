"""The admission-policy options a scheduler composes: the waiting queue's order and
priority preemption, beside the per-request state they read.

A run whose policy keys are all defaults has no :class:`PolicyOptions` and none of this
machinery. Otherwise every request gets a :class:`RequestPolicy` when it arrives (its
resolved priority, deadline, cancel time, when it last entered the queue) and the
scheduler runs, before each admission:

* :class:`QueueOrder`: the waiting queue sorted in place, SGLang's ``calc_priority``
  (:class:`~cpkv.admission.schedule_policy.WaitingQueueOrder`) or cpkv's earliest deadline
  first with an aging bound (:func:`~cpkv.policies.deadline.deadline_sort`). Cache-aware
  orders match requests with the engine's hits (page aligned, capped below the prompt:
  :class:`~cpkv.serving.model.hits.PrefixHits`), ``dfs-weight`` breaks ties between equally
  heavy subtrees by first appearance in the queue;
* :class:`PriorityPreemption`: with priority scheduling, running requests preempted for more
  urgent waiting ones (:func:`~cpkv.admission.schedule_policy.choose_preemption`), for the
  queue's head requests while the running set is at ``max_running_requests``. SGLang calls
  it inside its scan, on the same condition; cpkv calls it before the pass. The candidate's
  need counts its real fill and device prefix (SGLang's first examination counts neither,
  a caveat of :mod:`cpkv.admission.schedule_policy.preempt`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cpkv.admission.schedule_policy import (
    RunningState,
    SchedulePolicyConfig,
    WaitingQueueOrder,
    choose_preemption,
    preemption_need_tokens,
)
from cpkv.policies.budgets import TokenWeights
from cpkv.policies.deadline import deadline_sort
from cpkv.policies.profiled import ProfiledSpec
from cpkv.serving.model.request import Req

if TYPE_CHECKING:
    from cpkv.serving.engine.engine import Engine


@dataclass(frozen=True)
class PolicyOptions:
    """The non-default admission-policy keys of a run (``admit.schedule_policy`` and the
    priority keys, ``admit.deadline``, ``admit.profiled``, ``admit.iteration.weights`` and
    ``verify_tokens``, ``admit.max_running_requests`` for the block policies,
    ``admit.kv.safety_margin_blocks``, ``admit.serving``'s ``on_preempt: swap``,
    ``queue_timeout_ms``, ``check_invariants``, ``cuda_graph_buckets``; ``cancellations``:
    the workload carries cancel times)."""

    schedule: SchedulePolicyConfig = SchedulePolicyConfig()
    deadline_aging_ms: float | None = None  # set: schedule_policy deadline
    slo_ttft_ms: float | None = None
    profiled: ProfiledSpec | None = None  # set: policy profiled
    weights: TokenWeights = TokenWeights()
    verify_tokens: int = 0
    max_running_requests: int | None = None  # block policies (prefill_adder: AdderBudgets)
    safety_margin_blocks: int = 0
    swap: bool = False
    queue_timeout_ms: float | None = None
    check_invariants: bool = False
    cuda_graph_buckets: tuple[int, ...] = ()
    seed: int = 0
    cancellations: bool = False


class RequestPolicy:
    """A request's policy state (``Req.policy``, set when it arrives)."""

    __slots__ = (
        "queue_entry_us", "deadline_us", "cancel_us", "arrival_processed_tokens",
        "swapped_tokens", "swap_device", "reserved_output_tokens", "reserved_blocks",
    )  # fmt: skip

    def __init__(self, entry_us: float, deadline_us: float, cancel_us: float) -> None:
        self.queue_entry_us, self.deadline_us, self.cancel_us = entry_us, deadline_us, cancel_us
        self.arrival_processed_tokens: int | None = None
        self.swapped_tokens = self.swap_device = 0
        self.reserved_output_tokens = -1  # profiled: output tokens reserved at admission
        self.reserved_blocks = 0  # profiled: blocks the reservation covers


class QueueOrder:
    """The waiting queue's order before each admission (module docstring)."""

    def __init__(self, opts: PolicyOptions, block_size: int) -> None:
        self.aging_us = None if opts.deadline_aging_ms is None else opts.deadline_aging_ms * 1000.0
        self.order = WaitingQueueOrder(opts.schedule, block_size=block_size, seed=opts.seed)

    @staticmethod
    def wanted(opts: PolicyOptions) -> bool:
        """Whether ``opts`` order the queue (else it stays first come, first served)."""
        schedule = opts.schedule
        return opts.deadline_aging_ms is not None or (
            schedule != SchedulePolicyConfig()
            and (schedule.schedule_policy != "fcfs" or schedule.enable_priority_scheduling)
        )

    def sort(self, engine: Engine) -> bool:
        """Sort ``engine.waiting`` (two or more requests); True when the order is the
        deadline's (a block policy's scan then examines the whole queue again)."""
        queue = list(engine.waiting)
        deadline = self.aging_us is not None
        if deadline:
            deadline_sort(queue, engine.now, self.aging_us)
        else:
            processed = engine.counters["prefill_tokens"]
            for r in queue:
                if r.policy.arrival_processed_tokens is None:
                    r.policy.arrival_processed_tokens = processed
            self.order.sort(queue, engine.hit, processed)
        engine.waiting.clear()
        engine.waiting.extend(queue)
        return deadline


class PriorityPreemption:
    """Running requests preempted for more urgent waiting ones (module docstring)."""

    def __init__(self, opts: PolicyOptions, max_running_requests: int | None) -> None:
        schedule = opts.schedule
        self.limit = max_running_requests
        self.threshold = schedule.priority_scheduling_preemption_threshold
        self.low_first = schedule.schedule_low_priority_values_first

    def preemptions(self, engine: Engine, decoded: int, chunked: int) -> Iterator[list[Req]]:
        """For each waiting request in queue order, while the running set (and ``chunked``,
        the chunked request's slot) is at the limit: the running requests it preempts, in
        batch order; the engine preempts them before the next is asked for."""
        limit = self.limit
        if limit is None:
            return  # the batch is never full: SGLang never preempts for priority
        pool = engine.pool
        for candidate in list(engine.waiting):
            if pool.n_running + chunked < limit:
                return
            running = pool.running_reqs()
            states = [
                RunningState(r.priority, r.policy.queue_entry_us, r.max_new_tokens, pool.gen_now(r))
                for r in running
            ]
            device, _host = engine.hit(candidate)
            need = preemption_need_tokens(candidate.fill_tokens, device, candidate.max_new_tokens)
            ratio = engine.ratio.current
            rem_total = (
                pool.free_blocks * pool.block_size - decoded - pool.headroom_tokens() * ratio
            )
            chosen = choose_preemption(
                candidate.priority, need, rem_total, states, ratio, self.threshold,
                self.low_first,
            )  # fmt: skip
            if chosen is None:
                return
            yield [running[i] for i in chosen.victims]
