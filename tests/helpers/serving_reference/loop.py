"""The serving loop (``admit.mode: serving``): arrivals, iterations, KV, time.

Each iteration (one forward pass), at simulated time ``now``:

1. requests that arrived by ``now`` join the waiting queue; one that could never fit the
   pool even alone (``ceil((prompt + max_new) / block) > capacity_blocks``, or for
   ``prefill_adder`` ``prompt + min(max_new, 4096) + page >= pool tokens``) is rejected,
   reason ``exceeds_kv_capacity``;
2. decode first: every running request generates one token, taking a KV block when its
   length crosses a block boundary; growth that does not fit preempts
   (:mod:`cpkv.serving.kv_pool`);
3. admission and prefill by the policy: ``prefill_adder`` runs one SGLang PrefillAdder
   pass (:mod:`cpkv.serving.adder`), the seed-004 policies their scans and the
   iteration token budget (:mod:`cpkv.serving.block_policies`). An admitted request takes
   blocks for its prompt minus its L1 hit at once, loads its L2 hit back (when at least
   ``load_back_threshold`` tokens) and computes the rest, chunk by chunk;
4. a request whose prompt is complete generates its first token (a block may be needed);
5. the iteration takes :meth:`~cpkv.serving.cost.model.CostModel.batch_us`; at its end
   the tokens are stamped, requests that generated ``max_new_tokens`` tokens finish, free
   their blocks and (trace workloads) insert their prompt blocks into the tiered cache,
   and preempted requests go back to the queue (or are aborted).

When nothing runs and nothing waits, time jumps to the next arrival (SGLang's ratio resets);
when requests only decode, :func:`~cpkv.serving.decode_stretch.decode_stretch` runs the
iterations up to the next event in a tight loop (same results, float for float).
The L1 tier of the prefix cache is modelled as its own partition of device memory: an L1
hit costs no pool blocks and no compute; an L2 hit costs pool blocks and load-back time.
``prefill_adder`` keeps SGLang's adaptive ``new_token_ratio``: after each decode step
(before that iteration's admission) one decay step, or, when the step preempted,
``min(1, (generated + 20 n) / (max_new + 1))`` over the ``n`` requests it kept (their
tokens before the step), as ``retract_decode`` sets it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cpkv.admission.token_ratio import NewTokenRatio
from cpkv.core.errors import CpkvError
from cpkv.serving.cost.model import CostModel
from cpkv.serving.workload import ServingRequest
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS, ceil_div
from tests.helpers.serving_reference.adder import AdderBudgets, adder_step
from tests.helpers.serving_reference.block_policies import block_step
from tests.helpers.serving_reference.decode_stretch import decode_stretch
from tests.helpers.serving_reference.hits import PrefixHits
from tests.helpers.serving_reference.kv_pool import (
    FINISHED,
    PREFILL,
    REJECTED,
    WAITING,
    KvPool,
    Req,
)

COUNTERS = (
    "prefill_tokens", "decode_tokens", "first_tokens", "loaded_tokens", "l1_hit_tokens", "admissions",
)  # fmt: skip


class SimulationStalled(CpkvError):
    """The serving loop stopped making progress (the message names the cause)."""


@dataclass(frozen=True)
class SimSettings:
    """Everything the loop reads (built from the ``admit`` block by the runner)."""

    policy: str = "prefill_adder"
    block_size: int = 16
    capacity_blocks: int = 1024
    scan: str = "first_fit"
    victim: str = "least_progress"
    on_preempt: str = "requeue"
    budget_tokens: int = 8192
    chunk_tokens: int = 8192
    adder: AdderBudgets = AdderBudgets(16, 16384, 8192)
    ratio: NewTokenRatio = NewTokenRatio()
    cost: CostModel = CostModel()
    stall_iterations: int = 1000


@dataclass
class SimResult:
    """Requests (input order) and per-iteration samples of one run."""

    requests: list[Req]
    end_us: float
    iterations: int
    timeline: tuple[list[float], list[float], list[int], list[int], list[int], list[int]]
    counters: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[int, str, str, int]] | None = None  # (iteration, rid, what, used blocks)
    # (iteration, decode tokens, prefill tokens, first tokens)
    log: list[tuple[int, int, int, int]] | None = None


class Sim:
    """One run of the serving loop; :func:`simulate` is the entry point."""

    def __init__(
        self, requests: Sequence[ServingRequest], settings: SimSettings, cache: Any, events: bool
    ) -> None:
        s = settings
        self.settings, self.policy, self.cache = s, s.policy, cache
        self.block_size = s.block_size
        self.reqs = [Req(i, r, r.arrival_ms * 1000.0) for i, r in enumerate(requests)]
        self.order = sorted(self.reqs, key=lambda r: (r.arrival_us, r.index))
        self.pool = KvPool(s.block_size, s.capacity_blocks, s.victim)
        self.log: list[tuple[int, int, int, int]] | None = [] if events else None
        if events:
            self.pool.events = []
        self.waiting: list[Req] = []
        self.prefilling: list[Req] = []
        self.completed: list[Req] = []
        self.chunked: Req | None = None
        self.ratio = s.ratio
        self.budget_tokens, self.chunk_tokens, self.scan = s.budget_tokens, s.chunk_tokens, s.scan
        self.now, self.next_arrival, self.iterations, self.stamp = 0.0, 0, 0, 0
        self.hits = PrefixHits(cache, s.block_size)
        self.hit = self.hits.hit
        self.scan_version, self.scan_free, self.scan_seen = -1, -1, 0
        self.stop_counts: dict[str, int] = {}
        self.counters: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
        self.counters["preemptions"] = {}
        self.counters["rejects"] = {}
        self.timeline = ([], [], [], [], [], [])
        self.prefill_tokens = self.prefill_context = self.loaded = self.admitted = 0
        self.prefill_attention_pairs = 0
        self.stalled = 0

    def admit(self, r: Req, device: int, host: int, reserve: int | None) -> None:
        """``r`` leaves the queue: blocks for its prompt minus its ``device`` prefix, load-back
        of its ``host`` hit (when at least ``load_back_threshold`` tokens)."""
        self.hits.touch(r)
        loaded = host if host >= max(1, self.settings.adder.load_back_threshold) else 0
        r.state, r.device_prefix, r.host_hit = PREFILL, device, loaded
        r.filled_tokens = device + loaded
        self.stamp += 1
        r.stamp = self.stamp
        self.pool.take(r, r.fill_tokens - device, reserve)
        if r.admitted_us is None:
            r.admitted_us = self.now
            r.l1_hit, r.l2_hit = device, loaded
        self.loaded += loaded
        self.counters["l1_hit_tokens"] += device
        self.admitted += 1

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> SimResult:
        order, pool = self.order, self.pool
        while True:
            self._arrive()
            if not (pool.n_running or self.prefilling or self.waiting or self.chunked):
                if self.next_arrival >= len(order):
                    break
                self.now = max(self.now, order[self.next_arrival].arrival_us)
                self.ratio = self.ratio.reset()
                continue
            quiet = not (self.waiting or self.prefilling or self.chunked)
            if quiet and pool.n_running and pool.events is None and decode_stretch(self):
                continue  # decode-only iterations ran up to the next event
            self._iteration()
        counters = self.counters
        counters["admission_stops"] = dict(sorted(self.stop_counts.items()))
        counters["final_used_blocks"] = pool.used_blocks
        counters["final_free_blocks"] = pool.free_blocks
        counters["final_new_token_ratio"] = self.ratio.current
        return SimResult(
            self.reqs, self.now, self.iterations, self.timeline, counters, pool.events, self.log
        )

    def _arrive(self) -> None:
        order, settings = self.order, self.settings
        pool_tokens = settings.capacity_blocks * self.block_size
        while self.next_arrival < len(order) and order[self.next_arrival].arrival_us <= self.now:
            r = order[self.next_arrival]
            self.next_arrival += 1
            total = r.prompt_tokens + r.max_new_tokens
            never = ceil_div(total, self.block_size) > settings.capacity_blocks or (
                self.policy == "prefill_adder"
                and r.prompt_tokens + min(r.max_new_tokens, CLIP_MAX_NEW_TOKENS) + self.block_size
                >= pool_tokens
            )
            if never:
                self._reject(r, "exceeds_kv_capacity")
                continue
            r.state, r.fill_tokens = WAITING, r.prompt_tokens
            self.waiting.append(r)

    def _reject(self, r: Req, reason: str) -> None:
        r.state, r.reject_reason, r.finished_us = REJECTED, reason, self.now
        rejects = self.counters["rejects"]
        rejects[reason] = rejects.get(reason, 0) + 1

    def _iteration(self) -> None:
        pool, settings = self.pool, self.settings
        pool.event_iteration = self.iterations
        idle = not (pool.n_running or self.prefilling or self.chunked)
        self.prefill_tokens = self.prefill_context = self.loaded = self.admitted = 0
        self.prefill_attention_pairs = 0
        self.completed = []
        decoded, decode_context, finishing = pool.decode() if pool.n_running else (0, 0, [])
        if decoded or pool.preempted:
            self._update_ratio()
        if self.policy == "prefill_adder":
            adder_step(self, decoded)
        else:
            block_step(self, decoded)
        firsts, completed = [], self.completed
        for k, r in enumerate(completed):
            if r.state != PREFILL:
                continue  # preempted by an earlier first token of this iteration
            if r.generated >= r.max_new_tokens:  # max_new_tokens 0: done without a token
                r.state = FINISHED  # its blocks are freed at the iteration's end (_end)
                finishing.append(r)
                continue
            if pool.grow_first_token(r, completed[k + 1 :]):
                firsts.append(r)
                pool.join(r, r.kv_tokens)
                if r.generated >= r.max_new_tokens:
                    finishing.append(r)
        duration = settings.cost.batch_us(
            self.prefill_tokens,
            decoded,
            decode_context,
            self.prefill_context,
            self.prefill_attention_pairs,
            self.loaded,
        )
        start = self.now
        self.now = now = start + duration
        timeline = self.timeline  # the iteration's state: after its allocations, before finishes
        timeline[0].append(start)
        timeline[1].append(duration)
        timeline[2].append(pool.used_blocks)
        timeline[3].append(settings.capacity_blocks - pool.free_blocks)
        timeline[4].append(pool.n_running)
        timeline[5].append(len(self.waiting))
        preempted = bool(pool.preempted)
        self._end(now, decoded, firsts, finishing)
        if self.log is not None:
            self.log.append((self.iterations, decoded, self.prefill_tokens, len(firsts)))
        self.iterations += 1
        if decoded or firsts:
            self.stalled = 0
        elif preempted or not (self.prefill_tokens or self.admitted):
            self.stalled += 1
        self._check_progress(idle)

    def _end(self, now: float, decoded: int, firsts: list[Req], finishing: list[Req]) -> None:
        pool, counters = self.pool, self.counters
        counters["decode_tokens"] += decoded
        counters["first_tokens"] += len(firsts)
        counters["prefill_tokens"] += self.prefill_tokens
        counters["loaded_tokens"] += self.loaded
        counters["admissions"] += self.admitted
        for r in firsts:  # the token was emitted, even when a later grower preempted r
            if r.first_token_us is None:  # (then r keeps it and recomputes prompt + token later)
                r.first_token_us = now
        for r in finishing:
            if r.state == WAITING:
                continue  # preempted after its last token
            if r.state != FINISHED:
                pool.leave(r)
                r.state = FINISHED
            else:  # max_new_tokens 0: finished without a token, never running
                pool.release_prefill(r)
            r.finished_us = now
            self.hits.insert(r)
        preempted = pool.preempted
        if preempted:
            counts = counters["preemptions"]
            for r, phase in preempted:
                key = f"kv_growth_{phase}"
                counts[key] = counts.get(key, 0) + 1
                if self.settings.on_preempt == "abort":
                    self._reject(r, "preempted")
                else:
                    r.fill_tokens = r.prompt_tokens + r.generated
                    r.filled_tokens = r.device_prefix = r.host_hit = r.kv_tokens = 0
                    self.waiting.append(r)
            pool.preempted = []

    def _update_ratio(self) -> None:
        """SGLang's adaptive ratio after a decode step: reset by a retraction (the requests
        kept, with the tokens they had before the step), else one decay step."""
        pool, ratio = self.pool, self.ratio
        if pool.preempted:
            kept = [(pool.gen_now(r) - 1, r.max_new_tokens) for r in pool.running_reqs()]
            self.ratio = ratio.retracted(kept)
        elif ratio.current > ratio.min_ratio:
            self.ratio = ratio.decayed()

    def _check_progress(self, idle: bool) -> None:
        if idle and not self.admitted and self.waiting:
            r = self.waiting[0]
            raise SimulationStalled(
                f"admit.mode=serving: no progress at t={self.now / 1000:.3f} ms (iteration "
                f"{self.iterations}): request {r.rid} (prompt {r.fill_tokens}, max_new {r.max_new_tokens}) cannot be "
                f"admitted even into an idle KV pool of {self.settings.capacity_blocks} blocks x {self.block_size} "
                f"tokens by policy {self.policy}; {len(self.waiting)} requests waiting"
            )
        if self.stalled >= self.settings.stall_iterations:
            raise SimulationStalled(
                f"admit.mode=serving: {self.stalled} iterations without a generated token preempted "
                f"or did nothing (a recompute livelock; t={self.now / 1000:.3f} ms; "
                f"{len(self.waiting)} waiting, {self.pool.n_running} running, {self.pool.free_blocks} of "
                f"{self.settings.capacity_blocks} blocks free; policy {self.policy}, victim order "
                f"{self.settings.victim}): try another admit.kv.victim, policy conservative or more KV "
                f"(admit.serving.stall_iterations sets the limit)"
            )


def simulate(
    requests: Sequence[ServingRequest],
    settings: SimSettings,
    cache: Any = None,
    events: bool = False,
) -> SimResult:
    """Run the serving loop; ``cache`` is a cold :class:`~cpkv.trace.prefix_cache.TieredPrefixCache`
    (or None); ``events`` records every growth/preemption event and a per-iteration log
    (slow: every decode step goes request by request; for tests)."""
    return Sim(requests, settings, cache, events).run()
