"""vLLM 0.32.0's KV block pool (``block_pool.py``): blocks, the free queue, the prefix-cache map.

- Block 0 is the null block, never handed out: ``num_gpu_blocks - 1`` are usable.
- The free queue is in eviction order (head first). Allocation pops from the head and drops
  the popped block's cached key then, not before. A request's blocks are freed tail-first:
  those without a key go to the head (reused first), keyed ones to the tail (LRU).
- A prefix hit on a free block (``ref_cnt`` 0) takes it out of the free queue (``touch``).
- The cache maps a block key to every block cached under it (vLLM does not deduplicate), in
  insertion order; a lookup takes the first.
- ``BlockKeys`` stands for vLLM's chained block hash: a full block's key is determined by its
  parent's key and its own tokens, interned to an integer (no collisions).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class Block:
    """One KV block: its id, how many requests hold it, its prefix-cache key (or None)."""

    __slots__ = ("block_id", "ref_cnt", "key")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.key: int | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt}, key={self.key})"


class BlockKeys:
    """Chained keys of full blocks: equal keys mean equal token prefixes, block for block."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}

    def extend(
        self, keys: list[int], tokens: list[int], num_full_blocks: int, block_size: int
    ) -> None:
        """Append to ``keys`` (a request's chain) the keys of its blocks up to ``num_full_blocks``."""
        ids = self._ids
        i = len(keys)
        parent = keys[-1] if keys else -1
        while i < num_full_blocks:
            chunk = tuple(tokens[i * block_size : (i + 1) * block_size])
            parent = ids.setdefault((parent, chunk), len(ids))
            keys.append(parent)
            i += 1

    @staticmethod
    def extend_content(
        keys: list[int], content: Callable[[int], Hashable], num_full_blocks: int
    ) -> None:
        """Append to ``keys`` the keys of blocks named by ``content(i)`` up to
        ``num_full_blocks``: the hash of (parent key, content), so that memory stays with the
        live requests over a long run (a 64-bit hash: two different prefixes share a key with
        a probability of about 2**-64 per pair)."""
        i = len(keys)
        parent = keys[-1] if keys else -1
        while i < num_full_blocks:
            parent = hash((parent, content(i)))
            keys.append(parent)
            i += 1


class BlockPool:
    """The blocks, the free queue (eviction order) and the prefix-cache map of one engine."""

    __slots__ = ("blocks", "enable_caching", "_free", "_cached")

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        self.blocks = [Block(i) for i in range(num_gpu_blocks)]
        self.enable_caching = enable_caching
        # Block 0 is the null block: taken off the queue at start, never returned.
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks[1:])
        self._cached: dict[int, dict[int, Block]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next to be reused) first."""
        return list(self._free)

    def cached_block(self, key: int) -> Block | None:
        """The first block cached under ``key``, or None."""
        blocks = self._cached.get(key)
        return next(iter(blocks.values())) if blocks else None

    def take(self, count: int) -> list[Block]:
        """Pop ``count`` blocks from the head of the free queue, dropping their cached keys."""
        if count > len(self._free):
            raise ValueError(f"cannot take {count} blocks, {len(self._free)} free")
        free = self._free
        out = []
        for _ in range(count):
            block = free.popitem(last=False)[1]
            if block.key is not None:
                self._uncache(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _uncache(self, block: Block) -> None:
        key = block.key
        blocks = self._cached.get(key)
        if blocks is not None and blocks.pop(block.block_id, None) is not None and not blocks:
            del self._cached[key]
        block.key = None

    def touch(self, blocks: list[Block]) -> None:
        """Take a hit's blocks: a free one leaves the free queue; every one gains a holder."""
        free = self._free
        for block in blocks:
            if block.ref_cnt == 0:
                del free[block.block_id]
            block.ref_cnt += 1

    def release(self, ordered: list[Block]) -> None:
        """Drop one holder of each block, given in eviction order (first evicted first)."""
        first: list[Block] = []
        last: list[Block] = []
        caching = self.enable_caching
        for block in ordered:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.key is None or not caching:
                    first.append(block)
                else:
                    last.append(block)
        free = self._free
        for block in reversed(first):
            free[block.block_id] = block
            free.move_to_end(block.block_id, last=False)
        for block in last:
            free[block.block_id] = block

    def cache(self, block: Block, key: int) -> None:
        """Cache a full block under ``key`` (beside any other block already cached under it)."""
        if block.key == key:
            return
        if block.key is not None:
            self._uncache(block)
        blocks = self._cached.get(key)
        if blocks is None:
            self._cached[key] = {block.block_id: block}
        elif block.block_id not in blocks:
            blocks[block.block_id] = block
        else:
            return
        block.key = key
