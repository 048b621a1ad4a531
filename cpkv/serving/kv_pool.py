"""The KV pool of the serving loop: blocks held, the running set, growth and preemption.

A request holds ``ceil(kv / block_size)`` blocks for its ``kv`` tokens in the pool: its
prompt minus its L1 hit (the L1 tier of the prefix cache is a separate partition of device
memory, see :mod:`cpkv.serving.loop`) plus every token it generated since it was
admitted; ``conservative`` also reserves ``ceil((kv + max_new left) / block_size)`` blocks
at admission and grows inside them. Every generated token takes its KV slot in the
iteration that generates it (seed 004's accounting).

The running set keeps aggregates so that a decode step costs O(1) when its growth fits:
with ``G`` the number of decode steps so far, a running request's KV length is
``base + G``, its context ``cbase + G``, its tokens left ``fin - G``. A step needs a new
block for every request whose length is a multiple of the block size: ``counts[(-G) %
block_size]`` requests (by ``base % block_size``). When those blocks do not fit, the step is
replayed request by request in running order (admission order): a request that needs a
block when none is free preempts victims chosen by ``admit.kv.victim`` (the
:data:`~cpkv.policies.growth.VICTIMS` registry, grower included) until one is free or it is
the victim itself, as in seed 004's growth loop.
"""

from __future__ import annotations

import heapq

from cpkv.policies.blocks import BlockRequest
from cpkv.policies.growth import VICTIMS, Holder
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS

PENDING, WAITING, PREFILL, RUNNING, FINISHED, REJECTED = range(6)


class Req:
    """One request's mutable state during a run (internal)."""

    __slots__ = (
        "i", "rid", "arrival", "prompt0", "max_new", "hash_ids", "l1s", "l2s", "state",
        "epoch", "gen", "P", "d", "h", "done", "kv", "reserved", "stamp", "base", "cbase",
        "fin", "adv", "admitted_at", "first_at", "finish_at", "preemptions", "l1_hit",
        "l2_hit", "recomputed", "prefilled", "reason",
    )  # fmt: skip

    def __init__(self, i: int, r, arrival_us: float) -> None:
        self.i, self.rid, self.arrival = i, r.rid, arrival_us
        self.prompt0, self.max_new, self.hash_ids = r.prompt_tokens, r.max_new_tokens, r.hash_ids
        self.l1s, self.l2s = r.l1_cached_tokens, r.l2_cached_tokens
        self.state, self.epoch, self.gen = PENDING, 0, 0
        self.P = self.d = self.h = self.done = self.kv = self.reserved = self.stamp = 0
        self.base = self.cbase = self.fin = 0
        self.adv = -1
        self.admitted_at = self.first_at = self.finish_at = None
        self.preemptions = self.recomputed = self.prefilled = 0
        self.l1_hit = self.l2_hit = None
        self.reason = None


class KvPool:
    """Blocks of the pool and the running set with its aggregates (see the module docstring)."""

    def __init__(self, block_size: int, capacity_blocks: int, victim: str) -> None:
        self.B, self.capacity = block_size, capacity_blocks
        self.free, self.used = capacity_blocks, 0
        self.choose = VICTIMS.get(victim)
        self.G = 0
        self.running: list[tuple[Req, int]] = []  # (request, epoch when it joined), lazily pruned
        self.n_run = 0
        self.counts_all = [0] * block_size
        self.counts_free = [0] * block_size
        self.sum_cbase = 0
        self.fin_heap: list[tuple[int, int, int, Req]] = []
        self.clip_heap: list[tuple[int, int, int, Req]] = []
        self.sum_fin_unclipped = self.n_unclipped = self.n_clipped = 0
        self.preempted: list[tuple[Req, str]] = []  # (victim, phase), drained by the loop
        self.events: list[tuple[int, str, str, int]] | None = None
        self.step = 0

    # -- holding blocks --------------------------------------------------------------------
    def take(self, r: Req, kv: int, reserve_tokens: int | None) -> None:
        """Give ``r`` blocks for ``kv`` tokens (and a reservation up to ``reserve_tokens``)."""
        B = self.B
        blocks = -(-kv // B)
        r.kv = kv
        r.reserved = -(-reserve_tokens // B) if reserve_tokens is not None else 0
        self.free -= max(blocks, r.reserved)
        self.used += blocks

    def fits(self, kv: int, reserve_tokens: int | None) -> bool:
        """Whether blocks for ``kv`` tokens (or the reservation) are free now."""
        need = -(-(kv if reserve_tokens is None else reserve_tokens) // self.B)
        return need <= self.free

    def _release(self, r: Req, kv: int) -> None:
        blocks = -(-kv // self.B)
        self.free += max(blocks, r.reserved)
        self.used -= blocks
        r.reserved = 0

    # -- the running set -------------------------------------------------------------------
    def kv_now(self, r: Req) -> int:
        """KV tokens ``r`` holds now (a running request that advanced this step counts it)."""
        if r.state != RUNNING:
            return r.kv
        return r.base + self.G + (r.adv == self.G)

    def gen_now(self, r: Req) -> int:
        """Tokens ``r`` generated so far."""
        if r.state != RUNNING:
            return r.gen
        return r.max_new - r.fin + self.G + (r.adv == self.G)

    def join(self, r: Req, kv: int) -> None:
        """``r`` (``kv`` tokens, ``r.gen`` generated) starts decoding."""
        G, B = self.G, self.B
        r.state = RUNNING
        r.base = kv - G
        r.cbase = kv + r.d - G
        r.fin = G + r.max_new - r.gen
        r.adv = -1
        self.running.append((r, r.epoch))
        self.n_run += 1
        self.counts_all[r.base % B] += 1
        if not r.reserved:
            self.counts_free[r.base % B] += 1
        self.sum_cbase += r.cbase
        heapq.heappush(self.fin_heap, (r.fin, r.stamp, r.epoch, r))
        if r.fin - G > CLIP_MAX_NEW_TOKENS:
            self.n_clipped += 1
            heapq.heappush(self.clip_heap, (r.fin - CLIP_MAX_NEW_TOKENS, r.stamp, r.epoch, r))
        else:
            self.n_unclipped += 1
            self.sum_fin_unclipped += r.fin

    def leave(self, r: Req) -> int:
        """Take ``r`` out of the running set, free its blocks; returns the KV it held."""
        kv = self.kv_now(r)
        r.gen = self.gen_now(r)
        B = self.B
        self.n_run -= 1
        self.counts_all[r.base % B] -= 1
        if not r.reserved:
            self.counts_free[r.base % B] -= 1
        self.sum_cbase -= r.cbase
        if r.fin - self.G > CLIP_MAX_NEW_TOKENS:
            self.n_clipped -= 1
        else:
            self.n_unclipped -= 1
            self.sum_fin_unclipped -= r.fin
        r.epoch += 1  # invalidates its heap entries
        r.state = PREFILL  # not running; the caller sets the final state
        self._release(r, kv)
        if len(self.running) > 2 * self.n_run + 32:
            self.running_reqs()
        return kv

    def release_prefill(self, r: Req) -> int:
        """Free the blocks of a request that is not running; returns its KV tokens."""
        kv = r.kv
        self._release(r, kv)
        r.epoch += 1
        return kv

    def running_reqs(self) -> list[Req]:
        """The running requests in the order they joined (prunes the stale entries)."""
        self.running = [(r, e) for r, e in self.running if r.epoch == e and r.state == RUNNING]
        return [r for r, _ in self.running]

    def headroom_tokens(self) -> int:
        """``sum(min(max_new - generated, 4096))`` over the running requests."""
        return (
            self.sum_fin_unclipped
            - self.n_unclipped * self.G
            + CLIP_MAX_NEW_TOKENS * self.n_clipped
        )

    def context_tokens(self) -> int:
        """Context tokens of the running requests (what one decode step reads)."""
        return self.sum_cbase + self.n_run * self.G

    # -- one decode step ---------------------------------------------------------------------
    def decode(self) -> tuple[int, int, list[Req]]:
        """Every running request generates one token; returns (tokens, context read,
        requests that generated their last token). Victims go to ``self.preempted``."""
        G, B = self.G, self.B
        phase = -G % B
        need = self.counts_free[phase]
        if self.events is None and need <= self.free:
            self.free -= need
            self.used += self.counts_all[phase]
            n = self.n_run
            ctx = self.sum_cbase + n * G
        else:
            n, ctx = self._decode_one_by_one(G, B)
        self.G = G = G + 1
        finishing = []
        heap = self.fin_heap
        while heap and heap[0][0] <= G:
            _, _, epoch, r = heapq.heappop(heap)
            if r.epoch == epoch and r.state == RUNNING:
                finishing.append(r)
        self.migrate_clipped()
        return n, ctx, finishing

    def migrate_clipped(self) -> None:
        """Requests with at most 4096 tokens left now count them unclipped."""
        clip, G = self.clip_heap, self.G
        while clip and clip[0][0] <= G:
            _, _, epoch, r = heapq.heappop(clip)
            if r.epoch == epoch and r.state == RUNNING:
                self.n_clipped -= 1
                self.n_unclipped += 1
                self.sum_fin_unclipped += r.fin

    def _decode_one_by_one(self, G: int, B: int) -> tuple[int, int]:
        """The step request by request; returns (requests that advanced, their context)."""
        n = ctx = 0
        for r in self.running_reqs():
            if r.state != RUNNING:
                continue  # preempted earlier in this step
            if (r.base + G) % B == 0:
                if not r.reserved:
                    if self.free < 1:
                        self._make_room(r, "decode", self.running_reqs())
                        if r.state != RUNNING:
                            continue
                    self.free -= 1
                self.used += 1
            r.adv = G
            n += 1
            ctx += r.cbase + G
            self._event(r, "advanced")
        return n, ctx

    def grow_first_token(self, r: Req, others: list[Req]) -> bool:
        """``r`` (just prefilled, holding ``r.kv``) generates its first token; victims are
        chosen among the running requests and ``others`` (this iteration's other completed
        prefills). Returns False when ``r`` itself was preempted."""
        if r.kv % self.B == 0:
            if not r.reserved:
                if self.free < 1:
                    self._make_room(r, "first_token", [*self.running_reqs(), r, *others])
                    if r.state != PREFILL:
                        return False
                self.free -= 1
            self.used += 1
        r.kv += 1
        r.gen += 1
        self._event(r, "advanced")
        return True

    def _make_room(self, grower: Req, phase: str, candidates: list[Req]) -> None:
        """Preempt victims until a block is free or ``grower`` is the victim."""
        while self.free < 1 and grower.state in (RUNNING, PREFILL):
            alive = [
                c
                for c in dict.fromkeys(candidates)
                if c.state == RUNNING or (c.state == PREFILL and c.done >= c.P)
            ]
            holders = {
                c.stamp: Holder(
                    c.stamp,
                    BlockRequest(c.rid, c.prompt0, c.max_new),
                    c.prompt0 + self.gen_now(c),
                    -(-self.kv_now(c) // self.B),
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
            self.events.append((self.step, r.rid, what, self.used))
