"""vLLM 0.32.0's KV block pool (``block_pool.py``): blocks, the free queue, the prefix-cache map.

- Block 0 is the null block, never handed out: ``num_gpu_blocks - 1`` are usable. Blocks are
  their ids (ints); the pool holds each one's holders (``ref``) and cached key (``key_of``).
- The free queue is in eviction order (head first). Allocation pops from the head and drops
  the popped block's cached key then, not before. A request's blocks are freed tail-first:
  those without a key go to the head (reused first), keyed ones to the tail (LRU).
- A prefix hit on a free block (no holder) takes it out of the free queue (``touch``).
- The cache maps a block key to every block cached under it (vLLM does not deduplicate), in
  insertion order; a lookup takes the first.
- ``BlockKeys`` stands for vLLM's chained block hash: a full block's key is determined by its
  parent's key and its own tokens, interned to an integer (no collisions).

How it is held (the decisions are those of vLLM's structures): the free
queue is a stack of unkeyed blocks (its top is the head) in front of a list of keyed blocks
(a read position moving towards its end; keyed blocks are appended). A hit takes a keyed block
out of the list's middle by marking its entry stale (the block records the position of its
live entry, ``pos``); allocation skips stale entries. The cache map holds a block, or an
insertion-ordered dict of the blocks when several share a key. A request's own key
(:func:`~cpkv.vllm.request.own_keys`, negative) names a block only that request holds: only
that request looks it up, and only after a preemption (a request holding blocks looks nothing
up), so such a block enters the map when its request is preempted
(:meth:`BlockPool.map_blocks`), not when it is cached (``mapped`` says which blocks are in the
map). Until then it is cached all the same: it keeps its key (the free queue puts it at the
tail) and :meth:`BlockPool.cached_map` lists it.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from typing import Final

from cpkv.vllm.request import is_own_key

NOT_IN_LIST: Final = -1
"""``pos`` of a block that has no live entry in the keyed list."""
TRIM = 65536
"""The keyed list drops the entries before its read position once they are this many and
more than half of it."""


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
        parent = keys[-1] if keys else -1
        for start in range(len(keys) * block_size, num_full_blocks * block_size, block_size):
            parent = ids.setdefault((parent, tuple(tokens[start : start + block_size])), len(ids))
            keys.append(parent)


class BlockPool:
    """The blocks, the free queue (eviction order) and the prefix-cache map of one engine."""

    __slots__ = (
        "num_blocks", "enable_caching", "ref", "key_of", "mapped", "pos", "num_free", "_stack",
        "_list", "_read", "_base", "_stale", "_cached",
    )  # fmt: skip

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        self.num_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref = [0] * num_gpu_blocks
        self.ref[0] = 1  # the null block: held for ever
        self.key_of: list[Hashable | None] = [None] * num_gpu_blocks
        self.mapped = [False] * num_gpu_blocks  # its key is in the cache map
        self._stack: list[int] = []  # unkeyed free blocks, the head of the queue last
        self._list: list[int] = list(range(1, num_gpu_blocks))  # then these, from _read on
        self._read = 0
        self._base = 0  # the position of _list[0] (positions count every entry ever added)
        self.pos = [NOT_IN_LIST] + list(range(num_gpu_blocks - 1))
        self._stale: list[int] = []  # positions of entries whose block left (a heap)
        self.num_free = num_gpu_blocks - 1
        self._cached: dict[Hashable, int | dict[int, None]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.num_free

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next to be reused) first."""
        out = self._stack[::-1]
        base, pos, ref = self._base, self.pos, self.ref
        for i in range(self._read, len(self._list)):
            block = self._list[i]
            if ref[block] == 0 and pos[block] == base + i:
                out.append(block)
        return out

    def cached_map(self) -> dict[Hashable, list[int]]:
        """Every cached key with its blocks in lookup order (the first is the one a hit takes)."""
        out = {
            key: [entry] if type(entry) is int else list(entry)
            for key, entry in self._cached.items()
        }
        key_of = self.key_of
        for block in self._unmapped():
            out.setdefault(key_of[block], []).append(block)
        return out

    def _unmapped(self) -> list[int]:
        """The cached blocks not in the map (own keys): at most one per key, cached after
        the key's blocks in the map (those of its request's earlier runs)."""
        key_of, mapped = self.key_of, self.mapped
        return [b for b in range(self.num_blocks) if key_of[b] is not None and not mapped[b]]

    def cached_block(self, key: Hashable) -> int | None:
        """The first block cached under ``key``, or None."""
        listed = self.cached_map().get(key)
        return listed[0] if listed else None

    def hit_blocks(self, keys: list[Hashable]) -> list[int]:
        """The blocks of the longest run of ``keys``, from the first, that are all cached
        (each the first block cached under its key)."""
        cached = self._cached
        hit: list[int] = []
        for key in keys:
            entry = cached.get(key)
            if entry is None:
                break
            hit.append(entry if type(entry) is int else next(iter(entry)))
        return hit

    def take(self, count: int) -> list[int]:
        """Pop ``count`` blocks from the head of the free queue, dropping their cached keys."""
        if count > self.num_free:
            raise ValueError(f"cannot take {count} blocks, {self.num_free} free")
        self.num_free -= count
        stack = self._stack
        if stack and count:
            n = min(count, len(stack))
            out = stack[: -n - 1 : -1]
            del stack[-n:]
            count -= n
        else:
            out = []
        if count:
            read = self._read
            stale = self._stale
            end = read + count
            if stale and stale[0] < self._base + end:
                end = self._take_skipping(out, count)
            else:
                out.extend(self._list[read:end])
            self._read = end
            if end > TRIM and 2 * end > len(self._list):
                del self._list[:end]
                self._base += end
                self._read = 0
        ref, key_of, mapped, cached = self.ref, self.key_of, self.mapped, self._cached
        for block in out:
            ref[block] = 1
            key = key_of[block]
            if key is not None:
                key_of[block] = None
                if mapped[block]:
                    mapped[block] = False
                    entry = cached.pop(key)
                    if entry != block:  # (several blocks under the key: this one leaves it)
                        self._uncache_shared(key, entry, block)
        return out

    def _uncache_shared(self, key: Hashable, entry: dict[int, None], block: int) -> None:
        del entry[block]
        if len(entry) > 1:
            self._cached[key] = entry
        else:
            self._cached[key] = next(iter(entry))

    def _take_skipping(self, out: list[int], count: int) -> int:
        """Append ``count`` live entries of the keyed list to ``out``; the new read index."""
        entries, ref, pos, stale = self._list, self.ref, self.pos, self._stale
        base, i = self._base, self._read
        while count:
            block = entries[i]
            if ref[block] == 0 and pos[block] == base + i:
                out.append(block)
                count -= 1
            i += 1
        while stale and stale[0] < base + i:
            heapq.heappop(stale)
        return i

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a hit's blocks: a free one leaves the free queue; every one gains a holder."""
        ref, pos = self.ref, self.pos
        for block in blocks:
            if ref[block] == 0:  # free and cached: an entry of the keyed list
                heapq.heappush(self._stale, pos[block])
                pos[block] = NOT_IN_LIST
                self.num_free -= 1
            ref[block] += 1

    def release(self, ordered: list[int]) -> None:
        """Drop one holder of each block, given in eviction order (first evicted first)."""
        ref, key_of, pos = self.ref, self.key_of, self.pos
        caching = self.enable_caching
        entries = self._list
        at = self._base + len(entries)
        head: list[int] = []
        freed = 0
        for block in ordered:
            held = ref[block] - 1
            ref[block] = held
            if held:
                continue
            freed += 1
            if key_of[block] is None or not caching:
                head.append(block)
                pos[block] = NOT_IN_LIST
            else:
                entries.append(block)
                pos[block] = at
                at += 1
        if head:
            head.reverse()  # the first evicted on top
            self._stack.extend(head)
        self.num_free += freed

    def cache(self, block: int, key: Hashable) -> None:
        """Cache a full block under ``key`` (beside any other block already cached under it);
        a request's own key enters the map later (module docstring)."""
        key_of = self.key_of
        old = key_of[block]
        if old is not None:
            if old == key:
                return
            if self.mapped[block]:  # (a held block named again: it leaves its old key)
                self._unmap(block, old)
        key_of[block] = key
        if is_own_key(key):
            return
        self._map(block, key)

    def map_blocks(self, blocks: Iterable[int]) -> None:
        """Put the cached blocks among ``blocks`` that are not in the map into it, in order:
        their request is preempted and may look them up when it is scheduled again."""
        key_of, mapped = self.key_of, self.mapped
        for block in blocks:
            key = key_of[block]
            if key is not None and not mapped[block]:
                self._map(block, key)

    def _map(self, block: int, key: Hashable) -> None:
        self.mapped[block] = True
        cached = self._cached
        held = len(cached)
        entry = cached.setdefault(key, block)
        if len(cached) > held:  # (the key was not cached: the block is its one entry)
            return
        if type(entry) is int:
            cached[key] = {entry: None, block: None}
        else:
            entry[block] = None

    def _unmap(self, block: int, key: Hashable) -> None:
        self.mapped[block] = False
        entry = self._cached.pop(key)
        if entry != block:
            self._uncache_shared(key, entry, block)

    def cache_blocks(self, blocks: list[int], keys: list[Hashable]) -> None:
        """Cache each full block under its key, in order (:meth:`cache` of each)."""
        if len(blocks) != len(keys):
            raise ValueError(f"{len(blocks)} blocks for {len(keys)} keys")
        for i in range(len(blocks)):
            self.cache(blocks[i], keys[i])
