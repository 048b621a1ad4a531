"""The prefix cache when L2 has no unpinned room: a block L2 cannot take is dropped from L1
too (L1 stays inside L2). Derived by hand, block size 4."""

from __future__ import annotations

from cpkv.trace.prefix_cache import CacheConfig, Hit, TieredPrefixCache


def test_a_block_l2_cannot_hold_is_not_kept_in_l1() -> None:
    # L1 8 tokens, L2 10. L2 evicts only blocks that are not in L1 ("pinned").
    cache = TieredPrefixCache(4, CacheConfig(l1_tokens=8, l2_tokens=10))
    cache.insert([1], 4)  # L1 {1:4}; L2 {1:4}
    cache.insert([2], 4)  # L1 {1:4, 2:4} (full); L2 {1:4, 2:4}
    cache.insert([3], 2)  # L1 evicts 1 (LRU): {2:4, 3:2}; L2 has room: {1:4, 2:4, 3:2} = 10
    # a 1-token prompt whose only block is 1: L1 takes it as 1 token (7 of 8 used); L2 already
    # holds block 1 whole (4 tokens) and keeps it: L2 {2:4, 3:2, 1:4} = 10, every block pinned
    cache.insert([1], 1)
    assert dict(cache.l1.blocks) == {2: 4, 3: 2, 1: 1} and cache.l1.used == 7
    assert dict(cache.l2.blocks) == {2: 4, 3: 2, 1: 4} and cache.l2.used == 10
    # block 9 (1 token) fits L1 (8 of 8) but L2 is full of pinned blocks: L2 refuses it, so
    # L1 drops it again; nothing else is evicted from either tier
    cache.insert([9], 1)
    assert dict(cache.l1.blocks) == {2: 4, 3: 2, 1: 1} and cache.l1.used == 7
    assert dict(cache.l2.blocks) == {2: 4, 3: 2, 1: 4} and cache.l2.used == 10
    assert cache.lookup([9, 5], 8) == Hit(0, 0)
    assert set(cache.l1.blocks) <= set(cache.l2.blocks)
    # the L1 copy of block 1 holds 1 token: a lookup of block 1 whole gets 1 token from L1,
    # then the other 3 from L2's whole copy (capped at input_length - 1 = 7 of the 8 needed:
    # block 1 (4) + block 2 (4) -> L1 1, L2 3 + 4 = 7 - 1)
    assert cache.lookup([1, 2], 8) == Hit(1, 6)
