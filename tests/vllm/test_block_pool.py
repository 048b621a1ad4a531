"""The block pool against a plain reference of vLLM's ``BlockPool`` on random operations.

The reference below is written for clarity, straight from vLLM's rules: an ordered free
queue (pop from the head; freed blocks tail-first, unkeyed to the head, keyed to the tail;
a hit on a free block takes it out of the middle), a map from key to the blocks cached under
it in insertion order (a lookup takes the first), a block's key dropped when it is popped.
The pool under test keeps the same queue as a stack and a list with stale entries; after every operation both must show the same free queue, the same map, the same
holders, and every lookup must agree. Long runs pass the list's trimming and the stale
entries' skipping; keys repeat (several blocks under one key) and batches are both below
and above ``LARGE``.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from cpkv.vllm import block_pool
from cpkv.vllm.block_pool import BlockPool
from cpkv.vllm.request import own_keys

LARGE = 8
"""Batches above this many blocks count as large (one-block and many-block steps both run)."""


class ReferencePool:
    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.caching = caching
        self.ref = [0] * num_blocks
        self.key: list = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self.cached: dict = {}

    def take(self, count: int) -> list[int]:
        out = []
        for _ in range(count):
            block = self.free.popitem(last=False)[0]
            key = self.key[block]
            if key is not None:
                del self.cached[key][block]
                if not self.cached[key]:
                    del self.cached[key]
                self.key[block] = None
            self.ref[block] = 1
            out.append(block)
        return out

    def touch(self, blocks: list[int]) -> None:
        for block in blocks:
            if self.ref[block] == 0:
                del self.free[block]
            self.ref[block] += 1

    def release(self, ordered: list[int]) -> None:
        first, last = [], []
        for block in ordered:
            self.ref[block] -= 1
            if self.ref[block] == 0:
                (first if self.key[block] is None or not self.caching else last).append(block)
        for block in reversed(first):
            self.free[block] = None
            self.free.move_to_end(block, last=False)
        for block in last:
            self.free[block] = None

    def cache(self, block: int, key) -> None:
        if self.key[block] == key:
            return
        if self.key[block] is not None:
            old = self.key[block]
            del self.cached[old][block]
            if not self.cached[old]:
                del self.cached[old]
        self.cached.setdefault(key, {})[block] = None
        self.key[block] = key

    def lookup(self, key):
        blocks = self.cached.get(key)
        return next(iter(blocks)) if blocks else None


def same(pool: BlockPool, ref: ReferencePool) -> None:
    assert pool.free_block_ids() == list(ref.free)
    assert pool.num_free == len(ref.free)
    assert pool.cached_map() == {k: list(v) for k, v in ref.cached.items()}
    assert pool.ref[1:] == ref.ref[1:]


def walk(seed: int, num_blocks: int, ops: int, caching: bool = True) -> tuple[dict, BlockPool]:
    rng = random.Random(seed)
    pool, ref = BlockPool(num_blocks, caching), ReferencePool(num_blocks, caching)
    held: list[list[int]] = []  # each a request's blocks, in holding order
    keys = list(range(3 * num_blocks))  # a small key space: keys repeat across blocks
    seen = {"large_take": 0, "shared_key": 0, "touch_free": 0, "large_release": 0}
    for _ in range(ops):
        roll = rng.random()
        if roll < 0.3 and len(ref.free):
            count = rng.randint(1, min(len(ref.free), 3 * LARGE))
            seen["large_take"] += count > LARGE
            blocks = pool.take(count)
            assert blocks == ref.take(count)
            cached = rng.randint(0, count) if caching else 0  # a cached prefix, as requests
            for block in blocks[:cached]:
                key = rng.choice(keys)
                seen["shared_key"] += ref.lookup(key) is not None
                ref.cache(block, key)
            if cached:
                chosen = [ref.key[b] for b in blocks[:cached]]
                if rng.random() < 0.5:
                    pool.cache_blocks(blocks[:cached], chosen)
                else:
                    for block, key in zip(blocks[:cached], chosen, strict=True):
                        pool.cache(block, key)
            held.append(blocks)
        elif roll < 0.45 and caching and ref.cached:
            # a hit: the first blocks under some keys, free or held
            hit = []
            for key in rng.sample(sorted(ref.cached), min(len(ref.cached), rng.randint(1, 6))):
                block = ref.lookup(key)
                assert pool.cached_block(key) == block
                if block not in hit:
                    hit.append(block)
            seen["touch_free"] += sum(1 for b in hit if ref.ref[b] == 0)
            pool.touch(hit)
            ref.touch(hit)
            held.append(hit)
        elif held:
            blocks = held.pop(rng.randrange(len(held)))
            seen["large_release"] += len(blocks) > LARGE
            pool.release(blocks[::-1])
            ref.release(blocks[::-1])
        for key in rng.sample(keys, 3):
            assert pool.cached_block(key) == ref.lookup(key)
        same(pool, ref)
    return seen, pool


SEEN: dict[str, int] = {}


@pytest.mark.parametrize("seed", range(12))
def test_the_pool_keeps_the_queue_and_map_of_the_reference(seed: int) -> None:
    seen, _ = walk(seed, num_blocks=(12, 40, 90)[seed % 3], ops=400, caching=seed % 4 != 3)
    for name, count in seen.items():
        SEEN[name] = SEEN.get(name, 0) + count


def test_the_walks_take_every_path() -> None:
    if len(SEEN) < 4:  # (run alone: walk again)
        for seed in range(12):
            seen, _ = walk(seed, num_blocks=(12, 40, 90)[seed % 3], ops=400)
            for name, count in seen.items():
                SEEN[name] = SEEN.get(name, 0) + count
    assert all(count > 20 for count in SEEN.values()), SEEN


def test_a_long_run_trims_the_list_and_skips_stale_entries(monkeypatch) -> None:
    # the list is trimmed every few hundred entries read (not every 65,536)
    monkeypatch.setattr(block_pool, "TRIM", 100)
    seen, pool = walk(99, num_blocks=50, ops=5000)
    assert seen["touch_free"] > 1000
    assert pool._base > 20 * 100  # (trimmed many times)


def own_walk(seed: int, num_blocks: int, ops: int) -> dict[str, int]:
    """Requests caching blocks under their own keys (:func:`own_keys`), preempted (their blocks
    mapped, then freed), scheduled again (a hit on what is left of them, the rest taken and
    cached anew: a key may then name two blocks), finished (freed unmapped), among requests
    that cache nothing: after every step the pool shows the reference's queue and map, and
    every hit agrees."""
    rng = random.Random(seed)
    pool, ref = BlockPool(num_blocks, True), ReferencePool(num_blocks, True)
    running: dict[int, list[int]] = {}  # owner -> its blocks (each cached under its own key)
    preempted: dict[int, int] = {}  # owner -> its number of blocks
    plain: list[list[int]] = []
    seen = {"hit": 0, "two_blocks_one_key": 0, "evicted_own": 0}
    owners = 0

    def key(owner: int, slot: int) -> int:
        return own_keys(owner) + slot

    for _ in range(ops):
        roll = rng.random()
        if roll < 0.35 and (preempted or rng.random() < 0.5):
            if preempted and rng.random() < 0.7:
                owner = rng.choice(sorted(preempted))
                size = preempted.pop(owner)
                wanted = [key(owner, s) for s in range(rng.randint(0, size))]
                hit = pool.hit_blocks(wanted)
                expected = []
                for k in wanted:
                    if ref.lookup(k) is None:
                        break
                    expected.append(ref.lookup(k))
                assert hit == expected
                seen["hit"] += bool(hit)
            else:
                owner, owners = owners, owners + 1
                size, hit = rng.randint(1, 2 * LARGE), []
            if size - len(hit) > len(ref.free) - sum(ref.ref[b] == 0 for b in hit):
                preempted[owner] = size  # (it waits: tried again later)
                continue
            pool.touch(hit)
            ref.touch(hit)
            new = pool.take(size - len(hit))
            assert new == ref.take(size - len(hit))
            blocks = hit + new
            for slot in range(len(hit), size):
                seen["two_blocks_one_key"] += ref.lookup(key(owner, slot)) is not None
                pool.cache(blocks[slot], key(owner, slot))
                ref.cache(blocks[slot], key(owner, slot))
            running[owner] = blocks
        elif roll < 0.55 and running:
            owner = rng.choice(sorted(running))
            blocks = running.pop(owner)
            if rng.random() < 0.6:  # preempted: its blocks enter the map, then go back
                pool.map_blocks(blocks)
                preempted[owner] = len(blocks)
            pool.release(blocks[::-1])
            ref.release(blocks[::-1])
        elif roll < 0.8 and len(ref.free):
            count = rng.randint(1, min(len(ref.free), LARGE))
            before = len(ref.cached)
            blocks = pool.take(count)
            assert blocks == ref.take(count)
            seen["evicted_own"] += len(ref.cached) < before
            plain.append(blocks)
        elif plain:
            blocks = plain.pop(rng.randrange(len(plain)))
            pool.release(blocks[::-1])
            ref.release(blocks[::-1])
        same(pool, ref)
    return seen


def test_own_keys_enter_the_map_when_their_request_is_preempted() -> None:
    seen = {"hit": 0, "two_blocks_one_key": 0, "evicted_own": 0}
    for seed in range(8):
        for name, count in own_walk(seed, num_blocks=(24, 60)[seed % 2], ops=500).items():
            seen[name] += count
    assert all(count > 10 for count in seen.values()), seen
