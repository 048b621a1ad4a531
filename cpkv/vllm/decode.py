"""Decode-only steps of vLLM 0.32.0's V1 scheduler, many at once.

While every running request decodes (``num_computed_tokens == num_tokens - 1``, its prompt
computed) and no request is admitted, each ``schedule()`` gives every running request one
token, in list order, and each ``update()`` appends one token to each: the state evolves
deterministically. A running request whose length crosses a block boundary takes one block
from the head of the free queue (its first crossing within ``block_size`` steps of now, then
one every ``block_size`` steps: the *phase* of the request), and caches each block it fills.
Such steps stay decode-only as long as every step's blocks fit the free queue (else the
running pass preempts) and no request finishes before the last of them.

:class:`DecodeSteps` describes the coming decode-only steps of a scheduler: how many run
before the first finish (``to_finish``), how many fit the free blocks (:meth:`fitting`), the
blocks each step takes (``phases``), the decode context (the running requests' lengths,
summed). :meth:`DecodeSteps.run` takes ``k`` of them at once with the outcome of ``k``
``schedule()`` + ``update()`` calls: the same blocks, taken from the free queue in the order
the steps would take them (step by step, running order within a step), the same blocks
cached, the same tokens, the requests that reach their end finished in running order at the
last step. Admission is the caller's business: it runs these steps only when the waiting
queue is empty or its head cannot be admitted in any of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cpkv.vllm.request import FINISHED

if TYPE_CHECKING:
    from cpkv.vllm.request import Request
    from cpkv.vllm.scheduler import Scheduler


class DecodeSteps:
    """The coming decode-only steps of one scheduler (module docstring).

    ``running``: the running requests in order; ``phases[p]``: how many of them take a block
    in step ``p`` (and in every step ``p + m * block_size``); ``first_block[i]``: the first
    step in which ``running[i]`` takes one; ``to_finish``: the steps up to and including the
    first in which a request reaches ``max_tokens`` or ``max_model_len``; ``context``: the
    decode context of the first step (every running request's length)."""

    __slots__ = ("scheduler", "running", "phases", "first_block", "to_finish", "context")

    def __init__(
        self,
        scheduler: Scheduler,
        phases: list[int],
        first_block: list[int],
        to_finish: int,
        context: int,
    ) -> None:
        self.scheduler, self.running = scheduler, scheduler.running
        self.phases, self.first_block = phases, first_block
        self.to_finish, self.context = to_finish, context

    @classmethod
    def of(cls, scheduler: Scheduler) -> DecodeSteps | None:
        """The scheduler's coming decode-only steps; None unless some request runs and every
        running request decodes."""
        running = scheduler.running
        if not running:
            return None
        config = scheduler.config
        bs, max_model_len = config.block_size, config.max_model_len
        phases = [0] * bs
        first_block: list[int] = []
        to_finish = max_model_len
        context = 0
        for request in running:
            num_tokens = request.num_tokens
            computed = request.num_computed_tokens
            if computed != num_tokens - 1 or computed < request.num_prompt_tokens:
                return None
            context += num_tokens
            # the step in which cdiv(num_tokens + j, bs) first exceeds the blocks held
            first = len(request.blocks) * bs + 1 - num_tokens
            if not 0 <= first < bs:
                return None
            phases[first] += 1
            first_block.append(first)
            left = request.stop_at - num_tokens
            if left < to_finish:
                to_finish = left
        return cls(scheduler, phases, first_block, to_finish, context)

    def taken(self, steps: int) -> int:
        """The blocks the first ``steps`` steps take, together."""
        bs = len(self.phases)
        whole, part = divmod(steps, bs)
        return whole * len(self.running) + sum(self.phases[:part])

    def fitting(self, free: int) -> int:
        """How many steps in a row find their blocks among ``free`` free blocks."""
        count = len(self.running)
        whole, left = divmod(free, count)
        part = 0
        for need in self.phases:  # the blocks of one more step fit while they do not exceed
            if need > left:
                break
            left -= need
            part += 1
        return whole * len(self.phases) + part

    def run(self, steps: int) -> list[str]:
        """Take ``steps`` decode-only steps (``1 <= steps <= min(to_finish, fitting(free))``);
        the ids of the requests that finish in the last of them, in running order."""
        scheduler = self.scheduler
        kv = scheduler.kv
        bs = len(self.phases)
        count = len(self.running)
        taken = self.taken(steps)
        fresh = kv.pool.take(taken) if taken else []
        # Step s takes blocks for the requests of phase s % bs, in running order: request i's
        # m-th block is the one popped after every block of the steps before its step, and
        # after those of the requests before it in the same phase.
        before = [0] * bs
        total = 0
        for p in range(bs):
            before[p] = total
            total += self.phases[p]
        rank = [0] * bs
        caching = kv.enable_caching
        pool = kv.pool
        finished: list[Request] = []
        last = steps == self.to_finish
        first_block = self.first_block
        i = 0
        for request in self.running:
            first = first_block[i]
            i += 1
            if first < steps:
                start = before[first] + rank[first]
                rank[first] += 1
                if steps - first <= bs:
                    request.blocks.append(fresh[start])
                else:
                    need = (steps - 1 - first) // bs + 1
                    request.blocks.extend(fresh[start : start + need * count : count])
            num_tokens = request.num_tokens
            end = num_tokens + steps - 1  # computed tokens after the last step
            if caching:
                cached = request.num_cached_blocks
                if end // bs == cached + 1:  # one block filled: cached at once
                    keys = request.block_keys
                    if len(keys) <= cached:
                        kv.block_keys(request, cached + 1)
                    pool.cache(request.blocks[cached], keys[cached])
                    request.num_cached_blocks = cached + 1
                elif end // bs > cached:
                    kv.cache_full_blocks(request, end)
            request.num_computed_tokens = end
            num_tokens += steps
            request.num_tokens = num_tokens
            if last and num_tokens >= request.stop_at:
                finished.append(request)
        scheduler.finished_ids = set()
        for request in finished:
            scheduler.finish(request)
        if finished:
            scheduler.running = [r for r in scheduler.running if r.status != FINISHED]
        return [r.request_id for r in finished]
