"""The coming decode steps of a pool's running requests as a scheduler that looks ahead
sees them: while only decode steps happen, the free blocks, the running requests' headroom
(``sum(min(max_new left, 4096))``) and SGLang's ``new_token_ratio`` after each step follow
from the pool's aggregates and the ratio's decay alone."""

from __future__ import annotations

from collections.abc import Iterator

from cpkv.admission.token_ratio import NewTokenRatio
from cpkv.serving.model.kv_pool import KvPool


def decode_steps_ahead(pool: KvPool, finish_step: int = -1) -> int:
    """The decode steps the running requests take before an event of theirs: up to the
    first one's last token (at ``finish_step``, the pool's next finish step when known, -1:
    looked up), while their growth fits (0 when none runs)."""
    if not pool.n_running:
        return 0
    if finish_step < 0:
        next_finish = pool.next_finish_step()
        assert next_finish is not None  # (a request runs)
        finish_step = next_finish
    return pool.fitting_steps(finish_step - pool.decode_steps)


def lookahead(
    pool: KvPool, ratio: NewTokenRatio, limit: int
) -> Iterator[tuple[int, int, int, float]]:
    """For each of the next iterations (at most ``limit``) while only decode steps happen
    in them: ``(free blocks, decode tokens, running headroom tokens, new_token_ratio)`` as
    the scheduler will see them, after that iteration's decode step (``ratio``: the
    :class:`~cpkv.admission.token_ratio.NewTokenRatio` now); it stops before a step whose
    growth does not fit, or after which a running request's remainder crosses 4096 (the
    headroom's clip)."""
    running = pool.n_running
    if not running:
        return
    free = pool.free_blocks
    for j, current in enumerate(ratio.decay_path(_steps(pool, limit)), 1):
        yield free - pool.needed_blocks(j), running, pool.headroom_tokens(j), current


def memory_refusals(pool: KvPool, ratio: NewTokenRatio, skip: int, limit: int, tokens: int) -> int:
    """Of the iterations :func:`lookahead` would give (at most ``limit``), after its first
    ``skip``: how many in a row leave the pass's memory budget, ``free blocks x block size
    - (decode tokens + headroom x ratio)``, at most ``tokens`` (the memory check of a
    request that needs ``tokens`` refuses it in each). The same numbers as
    :func:`lookahead`'s, taken a step at a time."""
    running = pool.n_running
    if not running:
        return 0
    block, free = pool.block_size, pool.free_blocks
    by_step, at = pool.unreserved_by_step, (pool.decode_steps - 1) % block
    needed = pool.needed_blocks(skip)  # grows by one phase's count a step
    headroom, per_step = pool.headroom_tokens(skip), pool.n_unclipped
    refused = 0
    path = ratio.decay_path(_steps(pool, limit))
    for j in range(skip, len(path)):
        current = path[j]
        needed += by_step[at + j % block]
        headroom -= per_step
        if tokens < (free - needed) * block - (running + headroom * current):
            break
        refused += 1
    return refused


def _steps(pool: KvPool, limit: int) -> int:
    """How many of the next ``limit`` decode steps :func:`lookahead` looks at."""
    steps = pool.fitting_steps(limit)
    clip = pool.next_clip_step()
    if clip is not None:
        steps = min(steps, clip - pool.decode_steps)
    return steps
