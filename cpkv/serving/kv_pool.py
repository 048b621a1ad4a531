"""The KV pool of the serving loop: blocks held, the running set, growth and preemption.

A request holds ``ceil(kv / block_size)`` blocks for its ``kv`` tokens in the pool: its
prompt minus its L1 hit (the L1 tier of the prefix cache is a separate partition of device
memory, see :mod:`cpkv.serving.loop`) plus every token it generated since it was
admitted; ``conservative`` also reserves ``ceil((kv + max_new left) / block_size)`` blocks
at admission and grows inside them. Every generated token takes its KV slot in the
iteration that generates it (seed 004's accounting).

The running set keeps aggregates so that a decode step costs O(1) when its growth fits:
with ``step`` the number of decode steps so far (``decode_steps``), a running request's KV
length is ``kv_base + step``, its context ``context_base + step``, its tokens left
``finish_step - step``. A step needs a new block for every request whose length is a
multiple of the block size: ``unreserved_by_phase[(-step) % block_size]`` requests (counted
by ``kv_base % block_size``; ``running_by_phase`` counts the reserved ones too). When those blocks do not fit, the step is
replayed request by request in running order (admission order): a request that needs a
block when none is free preempts victims chosen by ``admit.kv.victim`` (the
:data:`~cpkv.policies.victims.VICTIMS` registry, grower included) until one is free or it is
the victim itself, as in seed 004's growth loop.
"""

from __future__ import annotations

import heapq

from cpkv.policies.blocks import BlockRequest
from cpkv.policies.victims import VICTIMS, Holder
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS, ceil_div

PENDING, WAITING, PREFILL, RUNNING, FINISHED, REJECTED = range(6)
TIMED_OUT, CANCELLED = 6, 7  # issue 13's terminal states (cpkv.serving.lifecycle)


class Req:
    """One request's mutable state during a run (internal)."""

    __slots__ = (
        "index", "rid", "arrival_us", "prompt_tokens", "max_new_tokens", "hash_ids", "fixed_l1_tokens", "fixed_l2_tokens", "state",
        "epoch", "generated", "fill_tokens", "device_prefix", "host_hit", "filled_tokens", "kv_tokens", "reserved_blocks", "stamp", "kv_base", "context_base",
        "finish_step", "advanced_step", "admitted_us", "first_token_us", "finished_us", "preemptions", "l1_hit",
        "l2_hit", "recomputed", "prefilled", "reject_reason", "ext",
    )  # fmt: skip

    def __init__(self, i: int, r, arrival_us: float) -> None:
        self.index, self.rid, self.arrival_us = i, r.rid, arrival_us
        self.prompt_tokens, self.max_new_tokens, self.hash_ids = (
            r.prompt_tokens,
            r.max_new_tokens,
            r.hash_ids,
        )
        self.fixed_l1_tokens, self.fixed_l2_tokens = r.l1_cached_tokens, r.l2_cached_tokens
        self.ext = r  # issue 13: the request as given; its policy state once it arrives
        self._fresh()

    # issue 13: what the waiting-queue orders read (cpkv.serving.lifecycle sets ``ext``
    # when the request arrives; only runs with policy options read these)
    output_tokens = property(lambda self: self.generated)
    priority = property(lambda self: self.ext.priority)
    queue_entry_us = property(lambda self: self.ext.queue_entry_us)
    arrival_processed_tokens = property(lambda self: self.ext.arrival_processed_tokens)
    deadline_us = property(lambda self: self.ext.deadline_us)

    @classmethod
    def new(
        cls,
        i: int,
        rid: str,
        arrival_us: float,
        prompt_tokens: int,
        max_new_tokens: int,
        l1_cached_tokens: int,
        l2_cached_tokens: int,
        hash_ids: tuple[int, ...] | None,
    ) -> Req:
        """Request ``i`` from its fields (lazy arrival streams build them one by one)."""
        r = cls.__new__(cls)
        r.index, r.rid, r.arrival_us = i, rid, arrival_us
        r.prompt_tokens, r.max_new_tokens, r.hash_ids = prompt_tokens, max_new_tokens, hash_ids
        r.fixed_l1_tokens, r.fixed_l2_tokens = l1_cached_tokens, l2_cached_tokens
        r.state = r.epoch = r.generated = r.fill_tokens = r.device_prefix = r.host_hit = 0
        r.filled_tokens = r.kv_tokens = r.reserved_blocks = r.stamp = r.kv_base = 0
        r.context_base = r.finish_step = r.preemptions = r.recomputed = r.prefilled = 0
        r.advanced_step = -1
        r.admitted_us = r.first_token_us = r.finished_us = r.l1_hit = r.l2_hit = None
        r.reject_reason = None
        return r

    def _fresh(self) -> None:
        self.state, self.epoch, self.generated = PENDING, 0, 0
        self.fill_tokens = self.device_prefix = self.host_hit = self.filled_tokens = (
            self.kv_tokens
        ) = self.reserved_blocks = self.stamp = 0
        self.kv_base = self.context_base = self.finish_step = 0
        self.advanced_step = -1
        self.admitted_us = self.first_token_us = self.finished_us = None
        self.preemptions = self.recomputed = self.prefilled = 0
        self.l1_hit = self.l2_hit = None
        self.reject_reason = None


class KvPool:
    """Blocks of the pool and the running set with its aggregates (see the module docstring)."""

    def __init__(self, block_size: int, capacity_blocks: int, victim: str) -> None:
        self.block_size, self.capacity_blocks = block_size, capacity_blocks
        self.free_blocks, self.used_blocks = capacity_blocks, 0
        self.choose = VICTIMS.get(victim)
        self.decode_steps = 0
        self.running: dict[Req, None] = {}  # the running requests, in the order they joined
        self.n_running = self.n_unreserved = 0
        self.running_by_phase = [0] * block_size
        self.unreserved_by_phase = [0] * block_size
        # the same counts in step order, twice: [i] = by_phase[(block - 1 - i) % block], so
        # that the steps from ``step`` on read them at [(step - 1) % block:] in one slice
        self.running_by_step = [0] * (2 * block_size)
        self.unreserved_by_step = [0] * (2 * block_size)
        self.context_base_sum = 0
        self.finish_heap: list[tuple[int, int, int, Req]] = []
        self.clip_heap: list[tuple[int, int, int, Req]] = []
        self.unclipped_finish_sum = self.n_unclipped = self.n_clipped = 0
        self.preempted: list[tuple[Req, str]] = []  # (victim, phase), drained by the loop
        self.events: list[tuple[int, str, str, int]] | None = None
        self.event_iteration = 0  # the iteration events are stamped with

    # -- holding blocks --------------------------------------------------------------------
    def take(self, r: Req, kv: int, reserve_tokens: int | None) -> None:
        """Give ``r`` blocks for ``kv`` tokens (and a reservation up to ``reserve_tokens``)."""
        block = self.block_size
        blocks = -(-kv // block)  # ceil_div, inline
        r.kv_tokens = kv
        if reserve_tokens is None:
            r.reserved_blocks = 0
            self.free_blocks -= blocks
        else:
            reserved = r.reserved_blocks = -(-reserve_tokens // block)
            self.free_blocks -= max(blocks, reserved)
        self.used_blocks += blocks

    def fits(self, kv: int, reserve_tokens: int | None) -> bool:
        """Whether blocks for ``kv`` tokens (or the reservation) are free now."""
        need = ceil_div(kv if reserve_tokens is None else reserve_tokens, self.block_size)
        return need <= self.free_blocks

    def _release(self, r: Req, kv: int) -> None:
        blocks = -(-kv // self.block_size)
        self.free_blocks += max(blocks, r.reserved_blocks)
        self.used_blocks -= blocks
        r.reserved_blocks = 0

    # -- the running set -------------------------------------------------------------------
    def kv_now(self, r: Req) -> int:
        """KV tokens ``r`` holds now (a running request that advanced this step counts it)."""
        if r.state != RUNNING:
            return r.kv_tokens
        return r.kv_base + self.decode_steps + (r.advanced_step == self.decode_steps)

    def gen_now(self, r: Req) -> int:
        """Tokens ``r`` generated so far."""
        if r.state != RUNNING:
            return r.generated
        return (
            r.max_new_tokens
            - r.finish_step
            + self.decode_steps
            + (r.advanced_step == self.decode_steps)
        )

    def join(self, r: Req, kv: int) -> None:
        """``r`` (``kv`` tokens, ``r.generated`` generated) starts decoding."""
        step, block = self.decode_steps, self.block_size
        r.state = RUNNING
        r.kv_base = kv_base = kv - step
        r.context_base = context_base = kv + r.device_prefix - step
        r.finish_step = finish = step + r.max_new_tokens - r.generated
        r.advanced_step = -1
        epoch = r.epoch
        self.running[r] = None
        self.n_running += 1
        phase = kv_base % block
        self.running_by_phase[phase] += 1
        at = block - 1 - phase
        self.running_by_step[at] += 1
        self.running_by_step[at + block] += 1
        if not r.reserved_blocks:
            self.unreserved_by_phase[phase] += 1
            self.unreserved_by_step[at] += 1
            self.unreserved_by_step[at + block] += 1
            self.n_unreserved += 1
        self.context_base_sum += context_base
        heapq.heappush(self.finish_heap, (finish, r.stamp, epoch, r))
        if finish - step > CLIP_MAX_NEW_TOKENS:
            self.n_clipped += 1
            heapq.heappush(self.clip_heap, (finish - CLIP_MAX_NEW_TOKENS, r.stamp, epoch, r))
        else:
            self.n_unclipped += 1
            self.unclipped_finish_sum += finish

    def leave(self, r: Req) -> int:
        """Take ``r`` out of the running set, free its blocks; returns the KV it held."""
        step = self.decode_steps
        advanced = r.advanced_step == step  # kv_now / gen_now of a running request, inline
        kv = r.kv_base + step + advanced
        r.generated = r.max_new_tokens - r.finish_step + step + advanced
        block = self.block_size
        phase = r.kv_base % block
        self.n_running -= 1
        self.running_by_phase[phase] -= 1
        at = block - 1 - phase
        self.running_by_step[at] -= 1
        self.running_by_step[at + block] -= 1
        if not r.reserved_blocks:
            self.unreserved_by_phase[phase] -= 1
            self.unreserved_by_step[at] -= 1
            self.unreserved_by_step[at + block] -= 1
            self.n_unreserved -= 1
        self.context_base_sum -= r.context_base
        if r.finish_step - step > CLIP_MAX_NEW_TOKENS:
            self.n_clipped -= 1
        else:
            self.n_unclipped -= 1
            self.unclipped_finish_sum -= r.finish_step
        r.epoch += 1  # invalidates its heap entries
        r.state = PREFILL  # not running; the caller sets the final state
        del self.running[r]
        blocks = -(-kv // block)  # self._release(r, kv), inline
        reserved = r.reserved_blocks
        self.free_blocks += blocks if blocks >= reserved else reserved
        self.used_blocks -= blocks
        r.reserved_blocks = 0
        return kv

    def release_prefill(self, r: Req) -> int:
        """Free the blocks of a request that is not running; returns its KV tokens."""
        kv = r.kv_tokens
        self._release(r, kv)
        r.epoch += 1
        return kv

    def running_reqs(self) -> list[Req]:
        """The running requests in the order they joined."""
        return list(self.running)

    def headroom_tokens(self) -> int:
        """``sum(min(max_new - generated, 4096))`` over the running requests."""
        return (
            self.unclipped_finish_sum
            - self.n_unclipped * self.decode_steps
            + CLIP_MAX_NEW_TOKENS * self.n_clipped
        )

    def context_tokens(self) -> int:
        """Context tokens of the running requests (what one decode step reads)."""
        return self.context_base_sum + self.n_running * self.decode_steps

    # -- one decode step ---------------------------------------------------------------------
    def decode(self) -> tuple[int, int, list[Req]]:
        """Every running request generates one token; returns (tokens, context read,
        requests that generated their last token). Victims go to ``self.preempted``."""
        step, block = self.decode_steps, self.block_size
        phase = -step % block
        need = self.unreserved_by_phase[phase]
        if self.events is None and need <= self.free_blocks:
            self.free_blocks -= need
            self.used_blocks += self.running_by_phase[phase]
            advanced = self.n_running
            context = self.context_base_sum + advanced * step
        else:
            advanced, context = self._decode_one_by_one(step, block)
        self.decode_steps = step = step + 1
        finishing = []
        heap = self.finish_heap
        while heap and heap[0][0] <= step:
            _, _, epoch, r = heapq.heappop(heap)
            if r.epoch == epoch and r.state == RUNNING:
                finishing.append(r)
        if self.clip_heap:
            self.migrate_clipped()
        return advanced, context, finishing

    def migrate_clipped(self) -> None:
        """Requests with at most 4096 tokens left now count them unclipped."""
        clip, step = self.clip_heap, self.decode_steps
        while clip and clip[0][0] <= step:
            _, _, epoch, r = heapq.heappop(clip)
            if r.epoch == epoch and r.state == RUNNING:
                self.n_clipped -= 1
                self.n_unclipped += 1
                self.unclipped_finish_sum += r.finish_step

    def _decode_one_by_one(self, step: int, block: int) -> tuple[int, int]:
        """The step request by request; returns (requests that advanced, their context)."""
        advanced = context = 0
        for r in self.running_reqs():
            if r.state != RUNNING:
                continue  # preempted earlier in this step
            if (r.kv_base + step) % block == 0:
                if not r.reserved_blocks:
                    if self.free_blocks < 1:
                        self._make_room(r, "decode", self.running_reqs())
                        if r.state != RUNNING:
                            continue
                    self.free_blocks -= 1
                self.used_blocks += 1
            r.advanced_step = step
            advanced += 1
            context += r.context_base + step
            self._event(r, "advanced")
        return advanced, context

    def grow_first_token(self, r: Req, others: list[Req]) -> bool:
        """``r`` (just prefilled, holding ``r.kv_tokens``) generates its first token; victims are
        chosen among the running requests and ``others`` (this iteration's other completed
        prefills). Returns False when ``r`` itself was preempted."""
        if r.kv_tokens % self.block_size == 0:
            if not r.reserved_blocks:
                if self.free_blocks < 1:
                    self._make_room(r, "first_token", [*self.running_reqs(), r, *others])
                    if r.state != PREFILL:
                        return False
                self.free_blocks -= 1
            self.used_blocks += 1
        r.kv_tokens += 1
        r.generated += 1
        if self.events is not None:
            self._event(r, "advanced")
        return True

    def _make_room(self, grower: Req, phase: str, candidates: list[Req]) -> None:
        """Preempt victims until a block is free or ``grower`` is the victim."""
        while self.free_blocks < 1 and grower.state in (RUNNING, PREFILL):
            alive = [
                c
                for c in dict.fromkeys(candidates)
                if c.state == RUNNING or (c.state == PREFILL and c.filled_tokens >= c.fill_tokens)
            ]
            holders = {
                c.stamp: Holder(
                    c.stamp,
                    BlockRequest(c.rid, c.prompt_tokens, c.max_new_tokens),
                    c.prompt_tokens + self.gen_now(c),
                    ceil_div(self.kv_now(c), self.block_size),
                )
                for c in alive
            }
            chosen = self.choose(list(holders.values()), holders[grower.stamp])
            victim = next(c for c in alive if c.stamp == chosen.order)
            kv = self.leave(victim) if victim.state == RUNNING else self.release_prefill(victim)
            victim.state = WAITING
            victim.recomputed += kv
            victim.preemptions += 1
            self.preempted.append((victim, phase))
            self._event(victim, "preempted")

    def _event(self, r: Req, what: str) -> None:
        if self.events is not None:
            self.events.append((self.event_iteration, r.rid, what, self.used_blocks))
