"""vLLM 0.32.0's KV cache manager (``kv_cache_manager.py`` with one full-attention group).

- ``computed_blocks``: the longest chain of cached full blocks of a request's tokens, capped at
  ``num_tokens - 1`` (the last token is always recomputed for its logits), whole blocks only.
- ``allocate_slots``: the blocks a step needs are ``cdiv(tokens that need a slot, block_size)``
  less the blocks held and hit, plus every hit block now sitting in the free queue (taking it
  makes it unfree). With ``full_sequence_must_fit`` (the scheduler's
  ``scheduler_reserve_full_isl``, waiting requests only) the whole sequence must fit first.
  The watermark is added for a waiting or preempted request when any request is running. On
  success the hit is taken, new blocks are popped, and every block that the step fills is
  cached at once: a request admitted later in the same step can hit it.
- ``free``: a request's blocks go back tail-first.
"""

from __future__ import annotations

from cpkv.vllm.block_pool import BlockKeys, BlockPool
from cpkv.vllm.config import SchedulerConfig
from cpkv.vllm.request import PREEMPTED, WAITING, Request, extend_own_keys, own_keys

NO_BLOCKS: list[int] = []


class KVCacheManager:
    """The KV blocks of every request of one engine, and the prefix cache over them."""

    __slots__ = (
        "pool",
        "keys",
        "block_size",
        "max_model_len",
        "enable_caching",
        "watermark_blocks",
    )

    def __init__(self, config: SchedulerConfig) -> None:
        self.pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self.keys = BlockKeys()
        self.block_size = config.block_size
        self.max_model_len = config.max_model_len
        self.enable_caching = config.enable_prefix_caching
        self.watermark_blocks = config.watermark_blocks

    def block_keys(self, request: Request, num_full_blocks: int) -> list[int]:
        """The request's block-key chain, extended to at least ``num_full_blocks`` blocks (a
        request's keys are fixed when it arrives: the first call names every block it can
        fill)."""
        keys = request.block_keys
        if len(keys) < num_full_blocks:
            most = request.stop_at // self.block_size
            if most < num_full_blocks:
                most = num_full_blocks
            if request.content is not None:
                request.content.extend(keys, most)
            else:
                prompt_blocks = request.num_prompt_tokens // self.block_size
                self.keys.extend(keys, request.tokens, min(prompt_blocks, most), self.block_size)
                extend_own_keys(keys, own_keys(request.index), most)  # generated tokens'
        return keys

    def computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The prefix hit of a request that holds no blocks: (hit blocks, hit tokens)."""
        if not self.enable_caching:
            return NO_BLOCKS, 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return NO_BLOCKS, 0
        keys = self.block_keys(request, max_blocks)
        hit = self.pool.hit_blocks(keys if len(keys) == max_blocks else keys[:max_blocks])
        return hit, len(hit) * self.block_size

    def blocks_to_allocate(self, request: Request, num_tokens: int, hit: list[int]) -> int:
        """New blocks needed to give the request ``num_tokens`` slots, hit blocks taken."""
        required = -(-num_tokens // self.block_size)
        num_held = len(request.blocks)
        if request.num_cached_blocks is not None or not hit:
            return max(required - num_held, 0)
        ref = self.pool.ref
        evictable = 0
        for block in hit:
            if ref[block] == 0:
                evictable += 1
        return max(required - len(hit) - num_held, 0) + evictable

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        hit: list[int] = NO_BLOCKS,
        num_hit_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        has_running: bool = True,
    ) -> bool:
        """Give the request slots for ``num_new_tokens`` more tokens; False if they do not fit."""
        computed = request.num_computed_tokens + num_hit_tokens
        if computed > self.max_model_len:
            computed = self.max_model_len
        watermark = 0
        if has_running and (request.status == WAITING or request.status == PREEMPTED):
            watermark = self.watermark_blocks
        free = self.pool.num_free
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self.blocks_to_allocate(request, full, hit) + watermark > free:
                return False
        need_slot = min(computed + num_new_tokens, self.max_model_len)
        if self.blocks_to_allocate(request, need_slot, hit) + watermark > free:
            return False
        blocks = request.blocks
        if request.num_cached_blocks is None and self.enable_caching:
            # A fresh admission: take the hit (touch) and start the cached count after it.
            if hit:
                self.pool.touch(hit)
                blocks.extend(hit)
            request.num_cached_blocks = len(hit)
        extra = -(-need_slot // self.block_size) - len(blocks)
        if extra > 0:
            blocks.extend(self.pool.take(extra))
        if self.enable_caching:
            self.cache_full_blocks(request, min(computed + num_new_tokens, request.num_tokens))
        return True

    def cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's blocks that ``num_tokens`` tokens fill (those not yet cached)."""
        start = request.num_cached_blocks
        end = num_tokens // self.block_size
        if start >= end:
            return
        keys = self.block_keys(request, end)
        self.pool.cache_blocks(request.blocks[start:end], keys[start:end])
        request.num_cached_blocks = end

    def free(self, request: Request, preempted: bool = False) -> None:
        """Return the request's blocks, tail first (so its tail is evicted first); a
        ``preempted`` request's cached blocks enter the cache map, all of them (its own
        keys: :meth:`~cpkv.vllm.block_pool.BlockPool.map_blocks`)."""
        blocks = request.blocks
        if preempted and request.num_cached_blocks:
            self.pool.map_blocks(blocks[: request.num_cached_blocks])
        request.blocks = []
        request.num_cached_blocks = None
        if blocks:
            blocks.reverse()
            self.pool.release(blocks)
