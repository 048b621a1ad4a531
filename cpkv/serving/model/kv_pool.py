"""The KV pool of a serving instance: blocks held, the running set, growth and preemption.

A request holds ``ceil(kv / block_size)`` blocks for its ``kv`` tokens: its prompt minus its
L1 hit (the L1 tier of the prefix cache is a separate partition of device memory) plus
every token it generated since it was admitted; ``conservative`` also reserves
``ceil((kv + max_new left) / block_size)`` blocks at admission and grows inside them. Every
generated token takes its KV slot in the iteration that generates it.

The running set keeps aggregates so that a decode step costs O(1) when its growth fits:
with ``step`` the number of decode steps so far (``decode_steps``), a running request's KV
length is ``kv_base + step``, its context ``context_base + step``, its tokens left
``finish_step - step``. A step needs a new block for every request whose length is a
multiple of the block size: ``unreserved_by_phase[(-step) % block_size]`` requests (counted
by ``kv_base % block_size``; ``running_by_phase`` counts the reserved ones too, whose growth
uses a block they hold already). The same counts in step order (``*_by_step``) give the
growth of the next ``k`` steps as one slice (:meth:`growth`), so that the engine can take
many steps at once (:meth:`advance`).

When a step's blocks do not fit, it is replayed request by request in running order
(admission order): a request that needs a block when none is free preempts victims chosen
by ``admit.kv.victim`` (:data:`~cpkv.policies.victims.VICTIMS`, grower included) until one
is free or it is the victim itself.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Final, cast

from cpkv.policies.victims import VICTIMS, Holder
from cpkv.serving.model.request import PREFILL, RUNNING, WAITING, Req
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS

CLIP: Final = CLIP_MAX_NEW_TOKENS


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
        self.preempted: list[tuple[Req, str]] = []  # (victim, phase), drained by the engine
        self.events: list[tuple[int, str, str, int]] | None = None
        self.event_iteration = 0  # the iteration events are stamped with

    # -- holding blocks ------------------------------------------------------------------
    def blocks_for(self, kv: int, reserve_tokens: int | None) -> int:
        """Free blocks that holding ``kv`` tokens (or the reservation, if larger) takes."""
        block = self.block_size
        blocks = -(-kv // block)
        if reserve_tokens is None:
            return blocks
        reserved = -(-reserve_tokens // block)
        return reserved if reserved > blocks else blocks

    def fits(self, kv: int, reserve_tokens: int | None) -> bool:
        """Whether blocks for ``kv`` tokens (and the reservation) are free now."""
        return self.blocks_for(kv, reserve_tokens) <= self.free_blocks

    def take(self, r: Req, kv: int, reserve_tokens: int | None) -> None:
        """Give ``r`` blocks for ``kv`` tokens (and a reservation up to ``reserve_tokens``)."""
        r.kv_tokens = kv
        r.reserved_blocks = 0 if reserve_tokens is None else -(-reserve_tokens // self.block_size)
        self.free_blocks -= self.blocks_for(kv, reserve_tokens)
        self.used_blocks += -(-kv // self.block_size)

    def _release(self, r: Req, kv: int) -> None:
        blocks = -(-kv // self.block_size)
        reserved = r.reserved_blocks
        self.free_blocks += blocks if blocks >= reserved else reserved
        self.used_blocks -= blocks
        r.reserved_blocks = 0

    def release_kv(self, kv: int, reserved_blocks: int) -> None:
        """Free the blocks of ``kv`` tokens (and a reservation) that a request which left the
        instance held."""
        blocks = -(-kv // self.block_size)
        self.free_blocks += blocks if blocks >= reserved_blocks else reserved_blocks
        self.used_blocks -= blocks

    def release_prefill(self, r: Req) -> int:
        """Free the blocks of a request that is not running; returns its KV tokens."""
        kv = r.kv_tokens
        self._release(r, kv)
        r.epoch += 1
        return kv

    # -- the running set -----------------------------------------------------------------
    def kv_now(self, r: Req) -> int:
        """KV tokens ``r`` holds now (a running request that advanced this step counts it)."""
        if r.state != RUNNING:
            return r.kv_tokens
        return r.kv_base + self.decode_steps + (r.advanced_step == self.decode_steps)

    def gen_now(self, r: Req) -> int:
        """Tokens ``r`` generated so far."""
        if r.state != RUNNING:
            return r.generated
        step = self.decode_steps
        return r.max_new_tokens - r.finish_step + step + (r.advanced_step == step)

    def _count(self, r: Req, sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) ``r``'s share of the running set's aggregates."""
        block = self.block_size
        phase = r.kv_base % block
        at = block - 1 - phase
        self.n_running += sign
        self.running_by_phase[phase] += sign
        self.running_by_step[at] += sign
        self.running_by_step[at + block] += sign
        if not r.reserved_blocks:
            self.n_unreserved += sign
            self.unreserved_by_phase[phase] += sign
            self.unreserved_by_step[at] += sign
            self.unreserved_by_step[at + block] += sign
        self.context_base_sum += sign * r.context_base

    def join(self, r: Req, kv: int) -> None:
        """``r`` (``kv`` tokens, ``r.generated`` generated) starts decoding."""
        step = self.decode_steps
        r.state = RUNNING
        r.kv_base = kv - step
        r.context_base = kv + r.device_prefix - step
        r.finish_step = finish = step + r.max_new_tokens - r.generated
        r.advanced_step = -1
        self.running[r] = None
        self._count(r, 1)
        heapq.heappush(self.finish_heap, (finish, r.stamp, r.epoch, r))
        if finish - step > CLIP:
            self.n_clipped += 1
            heapq.heappush(self.clip_heap, (finish - CLIP, r.stamp, r.epoch, r))
        else:
            self.n_unclipped += 1
            self.unclipped_finish_sum += finish

    def leave(self, r: Req) -> int:
        """Take ``r`` out of the running set and free its blocks; returns the KV it held.
        Its state becomes ``PREFILL`` (not running): the caller sets the final one."""
        step = self.decode_steps
        advanced = r.advanced_step == step
        kv = r.kv_base + step + advanced
        r.generated = r.max_new_tokens - r.finish_step + step + advanced
        self._count(r, -1)
        if r.finish_step - step > CLIP:
            self.n_clipped -= 1
        else:
            self.n_unclipped -= 1
            self.unclipped_finish_sum -= r.finish_step
        r.epoch += 1  # invalidates its heap entries
        r.state = PREFILL
        del self.running[r]
        self._release(r, kv)
        return kv

    def running_reqs(self) -> list[Req]:
        """The running requests in the order they joined."""
        return list(self.running)

    def headroom_tokens(self, steps_ahead: int = 0) -> int:
        """``sum(min(max_new - generated, 4096))`` over the running requests, ``steps_ahead``
        decode steps from now (while no request's remainder crosses 4096:
        :meth:`next_clip_step`)."""
        return (
            self.unclipped_finish_sum
            - self.n_unclipped * (self.decode_steps + steps_ahead)
            + CLIP * self.n_clipped
        )

    def context_tokens(self) -> int:
        """Context tokens of the running requests (what one decode step reads)."""
        return self.context_base_sum + self.n_running * self.decode_steps

    # -- what the next steps hold ----------------------------------------------------------
    def _top(self, heap: list[tuple[int, int, int, Req]]) -> int | None:
        while heap:
            _, _, epoch, r = heap[0]
            if r.epoch == epoch and r.state == RUNNING:
                return heap[0][0]
            heapq.heappop(heap)  # an entry of a request that left
        return None

    def next_finish_step(self) -> int | None:
        """The step count at which the first running request has generated its last token."""
        return self._top(self.finish_heap)

    def next_clip_step(self) -> int | None:
        """The step count at which a running request's remainder first drops to 4096."""
        return self._top(self.clip_heap)

    def needed_blocks(self, steps: int) -> int:
        """Free blocks the next ``steps`` decode steps need."""
        return self._blocks_over(steps, self.n_unreserved, self.unreserved_by_step)

    def _blocks_over(self, steps: int, per_cycle: int, by_step: list[int]) -> int:
        """The blocks the next ``steps`` decode steps take, ``by_step`` the counts of one
        cycle of ``block_size`` steps in step order (``per_cycle``: their sum)."""
        block = self.block_size
        blocks = steps // block * per_cycle
        at = (self.decode_steps - 1) % block
        for i in range(at, at + steps % block):
            blocks += by_step[i]
        return blocks

    def fitting_steps(self, limit: int) -> int:
        """The most decode steps, at most ``limit``, whose growth fits the free blocks."""
        n, free, block = self.n_unreserved, self.free_blocks, self.block_size
        if not n or free >= n * (-(-limit // block)):
            return limit
        cycles = min(limit // block, free // n)
        left = free - cycles * n
        at = (self.decode_steps - 1) % block
        steps = cycles * block
        by_step = self.unreserved_by_step
        while steps < limit:
            need = by_step[at + steps % block]
            if need > left:
                break
            left -= need
            steps += 1
        return steps

    def growth(self, steps: int) -> tuple[list[int], list[int] | None]:
        """The blocks each of the next ``min(steps, block_size)`` decode steps uses, and the
        free blocks each needs when that differs (a reservation covers some growth); the
        counts repeat with the block size."""
        at = (self.decode_steps - 1) % self.block_size
        m = min(steps, self.block_size)
        used = self.running_by_step[at : at + m]
        if self.n_unreserved == self.n_running:
            return used, None
        return used, self.unreserved_by_step[at : at + m]

    def advance(self, steps: int) -> None:
        """Take ``steps`` decode steps at once (their growth fits: :meth:`fitting_steps`);
        requests that reach their last token stay in the running set (the caller ends them)."""
        self.free_blocks -= self._blocks_over(steps, self.n_unreserved, self.unreserved_by_step)
        self.used_blocks += self._blocks_over(steps, self.n_running, self.running_by_step)
        self.decode_steps += steps
        if self.clip_heap:
            self.migrate_clipped()

    def finishing(self) -> list[Req]:
        """The running requests that have generated their last token, taken off the heap."""
        out = []
        heap, step = self.finish_heap, self.decode_steps
        while heap and heap[0][0] <= step:
            _, _, epoch, r = heapq.heappop(heap)
            if r.epoch == epoch and r.state == RUNNING:
                out.append(r)
        return out

    # -- one decode step -----------------------------------------------------------------
    def decode(self) -> tuple[int, int, list[Req]]:
        """Every running request generates one token; returns (tokens, context read,
        requests that generated their last token). Victims go to ``self.preempted``."""
        step = self.decode_steps
        phase = -step % self.block_size
        need = self.unreserved_by_phase[phase]
        if self.events is None and need <= self.free_blocks:
            self.free_blocks -= need
            self.used_blocks += self.running_by_phase[phase]
            advanced = self.n_running
            context = self.context_base_sum + advanced * step
        else:
            advanced, context = self._decode_one_by_one(step)
        self.decode_steps = step + 1
        if self.clip_heap:
            self.migrate_clipped()
        return advanced, context, self.finishing()

    def migrate_clipped(self) -> None:
        """Requests with at most 4096 tokens left now count them unclipped."""
        clip, step = self.clip_heap, self.decode_steps
        while clip and clip[0][0] <= step:
            _, _, epoch, r = heapq.heappop(clip)
            if r.epoch == epoch and r.state == RUNNING:
                self.n_clipped -= 1
                self.n_unclipped += 1
                self.unclipped_finish_sum += r.finish_step

    def _decode_one_by_one(self, step: int) -> tuple[int, int]:
        """The step request by request; returns (requests that advanced, their context)."""
        advanced = context = 0
        block = self.block_size
        for r in self.running_reqs():
            if r.state != RUNNING:
                continue  # preempted earlier in this step
            if (r.kv_base + step) % block == 0:
                if not r.reserved_blocks:
                    if self.free_blocks < 1:
                        self._make_room(r, "decode", ())
                        if r.state != RUNNING:
                            continue
                    self.free_blocks -= 1
                self.used_blocks += 1
            r.advanced_step = step
            advanced += 1
            context += r.context_base + step
            self._event(r, "advanced")
        return advanced, context

    def grow_first_token(self, r: Req, others: Sequence[Req]) -> bool:
        """``r`` (just prefilled, holding ``r.kv_tokens``) generates its first token; victims
        are chosen among the running requests and ``others`` (this iteration's other
        completed prefills). Returns False when ``r`` itself was preempted."""
        if r.kv_tokens % self.block_size == 0:
            if not r.reserved_blocks:
                if self.free_blocks < 1:
                    self._make_room(r, "first_token", (r, *others))
                    if r.state != PREFILL:
                        return False
                self.free_blocks -= 1
            self.used_blocks += 1
        r.kv_tokens += 1
        r.generated += 1
        self._event(r, "advanced")
        return True

    def _make_room(self, grower: Req, phase: str, beside: Sequence[Req]) -> None:
        """Preempt victims until a block is free or ``grower`` is the victim; the candidates
        are the running requests, then ``beside`` (requests not running yet)."""
        while self.free_blocks < 1 and grower.state in (RUNNING, PREFILL):
            victim = self._victim(grower, beside)
            kv = self.leave(victim) if victim.state == RUNNING else self.release_prefill(victim)
            victim.state = WAITING
            victim.recomputed += kv
            victim.preemptions += 1
            self.preempted.append((victim, phase))
            self._event(victim, "preempted")

    def _victim(self, grower: Req, beside: Sequence[Req]) -> Req:
        """The victim order's choice among the candidates still holding KV, read as the
        order asks for them (the default names the grower and reads none)."""
        chosen = self.choose(self._holders(beside), self._holder(grower))
        return cast(Req, chosen.request)

    def _holders(self, beside: Sequence[Req]) -> Iterator[Holder]:
        """The running requests, then ``beside``, each once, those still holding KV."""
        seen: set[Req] = set()
        for c in chain(self.running, beside):
            if c in seen:
                continue
            seen.add(c)
            if c.state == RUNNING or (c.state == PREFILL and c.filled_tokens >= c.fill_tokens):
                yield self._holder(c)

    def _holder(self, r: Req) -> Holder:
        return Holder(
            r.stamp, r, r.prompt_tokens + self.gen_now(r), -(-self.kv_now(r) // self.block_size)
        )

    def _event(self, r: Req, what: str) -> None:
        if self.events is not None:
            self.events.append((self.event_iteration, r.rid, what, self.used_blocks))
