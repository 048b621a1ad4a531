"""One step of vLLM 0.32.0's V1 scheduler (``Scheduler.schedule`` and ``update_from_output``).

``schedule()``:

1. The long-prefill cap (``long_prefill_token_threshold``) applies only when more than one
   request is running or waiting at the start of the step (adaptive: floored at
   ``max_num_batched_tokens // that count``).
2. RUNNING requests first, in list order (admission order). Each gets ``num_tokens -
   num_computed_tokens``, capped by the long-prefill cap, the token budget left and
   ``max_model_len - num_computed_tokens - 1``; 0 skips it. When its slots do not fit, the
   victim is preempted and the allocation retried, until it fits: fcfs takes the last running
   request, priority the running request with the highest ``(priority, arrival_time)`` (its
   tokens go back to the budget if it was already scheduled). A request that is its own victim
   ends the running pass (0.32.0). The pass also ends when the budget is spent.
3. WAITING requests only if nothing was preempted: while budget is left and fewer than
   ``max_num_seqs`` (``max_num_active_seqs``) run, the head of the queue gets its prefix hit and
   a chunk of ``num_tokens - hit`` capped by the long-prefill cap and the budget; with
   ``scheduler_reserve_full_isl`` its whole sequence must fit first. The first that does not
   fit ends admission (head-of-line blocking); admission never preempts.
4. ``num_computed_tokens`` advances by the scheduled tokens at once.

``update(plan)`` appends one token to each scheduled request whose prefill is complete,
finishes those at ``max_tokens`` or ``max_model_len`` and frees their blocks, in the order they
were scheduled.
"""

from __future__ import annotations

from cpkv.vllm.config import SchedulerConfig
from cpkv.vllm.kv_cache import KVCacheManager
from cpkv.vllm.queue import make_queue
from cpkv.vllm.request import FINISHED, PREEMPTED, RUNNING, WAITING, Request

Entry = tuple[str, int, int]
"""A scheduled request in a record: (request id, tokens scheduled, computed tokens before)."""


class StepPlan:
    """What one ``schedule()`` decided.

    ``running``: the running requests scheduled, in order, as (request, tokens, computed before);
    ``admitted``: the waiting requests admitted, in order, as (request, tokens, hit, resumed);
    ``preempted``: the ids preempted (sorted); ``failed``: the ``allocate_slots`` calls that did
    not fit, as (request id, "running" or "waiting", tokens); ``last_waiting_fit``: whether the
    last admission's slots fitted (None when none was tried); ``total_tokens``.
    """

    __slots__ = ("running", "admitted", "preempted", "failed", "last_waiting_fit", "total_tokens")

    def __init__(self) -> None:
        self.running: list[tuple[Request, int, int]] = []
        self.admitted: list[tuple[Request, int, int, bool]] = []
        self.preempted: list[str] = []
        self.failed: list[tuple[str, str, int]] = []
        self.last_waiting_fit: bool | None = None
        self.total_tokens = 0

    def new_entries(self) -> list[Entry]:
        return [(r.request_id, n, c) for r, n, c, resumed in self.admitted if not resumed]

    def resumed_entries(self) -> list[Entry]:
        return [(r.request_id, n, c) for r, n, c, resumed in self.admitted if resumed]

    def running_entries(self) -> list[Entry]:
        return [(r.request_id, n, c) for r, n, c in self.running]

    @property
    def num_scheduled(self) -> dict[str, int]:
        """Request id -> tokens, in the order of vLLM's ``num_scheduled_tokens``."""
        out = {r.request_id: n for r, n, _ in self.running}
        out.update((r.request_id, n) for r, n, _, _ in self.admitted)
        return out


class Scheduler:
    """vLLM 0.32.0's V1 scheduler for one engine: queues, KV cache, one step at a time."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.kv = KVCacheManager(config)
        self.waiting = make_queue(config.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_ids: set[str] = set()
        self._priority = config.policy == "priority"
        self._max_active = config.max_active_requests

    @property
    def free_blocks(self) -> int:
        return self.kv.pool.num_free

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.num_tokens >= self.config.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt of {request.num_tokens} "
                f"tokens does not fit max_model_len={self.config.max_model_len}"
            )
        request.stop_at = min(
            self.config.max_model_len, request.num_prompt_tokens + request.max_tokens
        )
        if self.config.enable_prefix_caching and request.content is None:
            # its blocks' keys, as vLLM hashes a prompt's blocks when the request is made (a
            # request known by its blocks' names is keyed at its first lookup: a long queue
            # of them holds no keys)
            self.kv.block_keys(request, request.stop_at // self.config.block_size)
        self.waiting.add(request)
        self.requests[request.request_id] = request

    def has_requests(self) -> bool:
        """Whether the engine would call ``schedule()``: live requests, or finishes not yet
        reported by a schedule() (so one empty step follows the last finish)."""
        return bool(self.running) or len(self.waiting) > 0 or bool(self.finished_ids)

    def _preempt(self, request: Request) -> None:
        request.discarded_tokens += request.num_computed_tokens
        self.kv.free(request, preempted=True)
        request.status = PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.prepend(request)

    def schedule(self) -> StepPlan:
        """One step's decisions (module docstring): the running requests, then, if nothing
        was preempted, the waiting ones."""
        config = self.config
        plan = StepPlan()
        num_eligible = len(self.running) + len(self.waiting)
        cap = config.long_prefill_token_threshold if num_eligible > 1 else 0
        if cap > 0 and config.long_prefill_token_threshold_adaptive:
            cap = max(cap, config.max_num_batched_tokens // num_eligible)
        budget = self._schedule_running(plan, config.max_num_batched_tokens, cap)
        if not plan.preempted:
            budget = self._admit_waiting(plan, budget, cap)
        plan.total_tokens = config.max_num_batched_tokens - budget
        if self.finished_ids:
            self.finished_ids = set()
        return plan

    def _schedule_running(self, plan: StepPlan, budget: int, cap: int) -> int:
        """The running pass: each running request's tokens, in list order, preempting until
        its slots fit; the budget left."""
        running = self.running
        config = self.config
        max_model_len, block_size = config.max_model_len, config.block_size
        caching = config.enable_prefix_caching
        kv = self.kv
        pool = kv.pool
        scheduled = plan.running
        preempted: list[Request] = []
        index = 0
        while index < len(running) and budget > 0:
            request = running[index]
            computed = request.num_computed_tokens
            n = request.num_tokens - computed
            if n == 1:  # one token (a decode): no cap cuts it, and it is below max_model_len
                end = computed + 1
                if end <= len(request.blocks) * block_size and not (
                    caching and end // block_size > request.num_cached_blocks
                ):  # its slot is held and it fills no block: nothing to allocate or cache
                    scheduled.append((request, 1, computed))
                    request.num_computed_tokens = end
                    budget -= 1
                    index += 1
                    continue
            if 0 < cap < n:
                n = cap
            if n > budget:
                n = budget
            if n > max_model_len - computed - 1:
                n = max_model_len - computed - 1
            if n <= 0:
                index += 1
                continue
            end = computed + n
            # allocate_slots for a running request: no hit, no full-sequence gate, no watermark.
            extra = -(-(end if end < max_model_len else max_model_len) // block_size) - len(
                request.blocks
            )
            while extra > pool.num_free:
                plan.failed.append((request.request_id, "running", n))
                victim, at = self._victim()
                if at < index:  # (priority: a request scheduled already gives its tokens back)
                    index -= 1
                    for k, entry in enumerate(scheduled):
                        if entry[0] is victim:
                            del scheduled[k]
                            budget += entry[1]
                            break
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            else:
                if extra > 0:
                    request.blocks.extend(pool.take(extra))
                if caching and end // block_size > request.num_cached_blocks:
                    kv.cache_full_blocks(request, end)
                scheduled.append((request, n, computed))
                request.num_computed_tokens = end
                budget -= n
                index += 1
                continue
            break  # the request preempted itself (0.32.0): the running pass ends
        if preempted:
            plan.preempted = sorted({r.request_id for r in preempted})
        return budget

    def _victim(self) -> tuple[Request, int]:
        """The running request to preempt, taken off the running list, and where it stood:
        fcfs the last, priority the highest ``(priority, arrival)``."""
        running = self.running
        if self._priority:
            victim = max(running, key=_victim_key)
            at = running.index(victim)
            del running[at]
            return victim, at
        return running.pop(), len(running)

    def _admit_waiting(self, plan: StepPlan, budget: int, cap: int) -> int:
        """The waiting pass: the queue's head while budget, blocks and ``max_num_seqs``
        allow (the first that does not fit ends it); the budget left."""
        kv, waiting, running = self.kv, self.waiting, self.running
        reserve_full = self.config.scheduler_reserve_full_isl
        admitted = plan.admitted
        while budget > 0 and len(waiting) > 0 and len(running) < self._max_active:
            request = waiting.peek()
            if request.num_computed_tokens == 0:
                hit, computed = kv.computed_blocks(request)
            else:  # not reached without KV connectors: waiting requests hold no KV
                hit, computed = [], request.num_computed_tokens
            n = request.num_tokens - computed
            if 0 < cap < n:
                n = cap
            if n > budget:
                n = budget
            fit = kv.allocate_slots(
                request,
                n,
                hit=hit,
                num_hit_tokens=computed,
                full_sequence_must_fit=reserve_full,
                has_running=bool(running),
            )
            plan.last_waiting_fit = fit
            if not fit:
                plan.failed.append((request.request_id, "waiting", n))
                break
            waiting.pop()
            running.append(request)
            admitted.append((request, n, computed, request.status != WAITING))
            budget -= n
            request.status = RUNNING
            request.num_computed_tokens = computed + n
        return budget

    def update(self, plan: StepPlan) -> list[str]:
        """Feed back one token per scheduled request whose prefill is complete; return the ids
        of the requests that finished (in scheduling order) after freeing their blocks."""
        finished: list[str] = []
        for entries in (plan.running, plan.admitted):
            for entry in entries:
                request = entry[0]
                num_tokens = request.num_tokens
                if request.num_computed_tokens < num_tokens:
                    continue  # a partial prefill chunk samples nothing
                num_tokens += 1
                request.num_tokens = num_tokens
                if num_tokens >= request.stop_at:  # max_tokens, or max_model_len
                    self.finish(request)
                    finished.append(request.request_id)
        if finished:
            self.running = [r for r in self.running if r.status != FINISHED]
        return finished

    def finish(self, request: Request) -> None:
        """``request`` reached its end: its blocks go back, the next ``schedule()`` reports it."""
        request.status = FINISHED
        self.finished_ids.add(request.request_id)
        self.kv.free(request)
        del self.requests[request.request_id]


def admission_stop(sched: Scheduler, plan: StepPlan) -> str:
    """What ended the step's admission of waiting requests, checked in this order:
    ``preempted_this_step`` (admission is skipped), ``queue_empty``, ``kv_blocks`` (the last
    admission's slots did not fit), ``token_budget``, ``max_num_seqs``, ``other``."""
    if plan.preempted:
        return "preempted_this_step"
    if len(sched.waiting) == 0:
        return "queue_empty"
    if plan.last_waiting_fit is False:
        return "kv_blocks"
    if plan.total_tokens >= sched.config.max_num_batched_tokens:
        return "token_budget"
    if len(sched.running) >= sched.config.max_active_requests:
        return "max_num_seqs"
    return "other"


def _victim_key(request: Request) -> tuple[int, float]:
    return (request.priority, request.arrival_time)
