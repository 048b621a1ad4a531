"""Hand-made traces through the tiered prefix cache, with hits derived by hand (block size 4)."""

from __future__ import annotations

import pytest

from cpkv.core.errors import ConfigError
from cpkv.trace.prefix_cache import CacheConfig, Hit, TieredPrefixCache


def make(l1=None, l2=None, page=1, ratio=None) -> TieredPrefixCache:
    return TieredPrefixCache(4, CacheConfig(l1, l2, ratio, page))


def test_shared_prefix_unlimited():
    cache = make()
    assert cache.lookup([1, 2, 3], 12) == Hit(0, 0)
    cache.insert([1, 2, 3], 12)
    # blocks 1, 2 shared (8 tokens), block 9 new
    assert cache.lookup([1, 2, 9], 12) == Hit(8, 0)
    # all 12 tokens cached, but one token is always computed: 11
    assert cache.lookup([1, 2, 3], 12) == Hit(11, 0)
    # a run stops at the first missing block even if later blocks are cached
    assert cache.lookup([1, 7, 3], 12) == Hit(4, 0)


def test_page_rounding_of_the_cap():
    cache = make(page=4)
    cache.insert([1, 2, 3], 12)
    # 11 tokens rounded down to pages of 4: 8
    assert cache.lookup([1, 2, 3], 12) == Hit(8, 0)
    cache = make(page=3)
    cache.insert([1, 2], 8)
    # run 8 tokens (cap 9 does not bind), floor to pages of 3: 6
    assert cache.lookup([1, 2, 3], 10) == Hit(6, 0)


def test_partial_last_block_covers_the_remainder():
    cache = make()
    cache.insert([1, 2, 3], 10)  # blocks hold 4, 4, 2 tokens
    assert cache.l1.used == 10
    assert cache.lookup([1, 2, 3], 10) == Hit(9, 0)  # 10, capped at 9


def test_shorter_stored_block_ends_the_run_and_grows_on_insert():
    cache = make()
    cache.insert([5, 6], 6)  # block 6 holds 2 tokens
    # the request needs block 6 whole (4 tokens): 4 + 2 cached, then the run stops
    assert cache.lookup([5, 6, 7], 12) == Hit(6, 0)
    cache.insert([5, 6, 7], 12)
    assert cache.l1.blocks == {5: 4, 6: 4, 7: 4}
    assert cache.l1.used == 12
    assert cache.lookup([5, 6, 7], 12) == Hit(11, 0)


def test_l1_evicts_least_recent_and_leaves_before_their_prefix():
    cache = make(l1=12, l2=0)  # room for three full blocks, no L2
    cache.insert([1, 2], 8)  # LRU -> MRU: 2, 1 (the prefix block is the more recent)
    cache.insert([5], 4)  # 2, 1, 5 (full)
    cache.insert([6], 4)  # evicts 2 (the leaf), not its prefix 1: 1, 5, 6
    assert list(cache.l1.blocks) == [1, 5, 6]
    assert cache.lookup([1, 2], 8) == Hit(4, 0)
    cache.insert([1, 4], 8)  # 4 evicts 5, then 1 moves to the end: 6, 4, 1
    assert list(cache.l1.blocks) == [6, 4, 1]
    assert cache.lookup([5], 4) == Hit(0, 0)
    assert cache.lookup([1, 4], 8) == Hit(7, 0)


def test_l2_keeps_blocks_evicted_from_l1():
    cache = make(l1=8, l2=16)
    cache.insert([1, 2], 8)  # L1: 2, 1; L2: 2, 1
    cache.insert([3, 4], 8)  # L1 evicts 2 then 1: L1 = 4, 3; L2 = 2, 1, 4, 3
    assert list(cache.l1.blocks) == [4, 3]
    assert list(cache.l2.blocks) == [2, 1, 4, 3]
    assert cache.lookup([1, 2], 8, touch=False) == Hit(0, 7)
    # L2 continues the L1 run: 3, 4 from L1 (8 tokens), then 1 from L2 (4): 12, capped 11
    assert cache.lookup([3, 4, 1], 12, touch=False) == Hit(8, 3)
    cache.insert([5], 4)  # L1 evicts 4 (L1 = 3, 5); L2 full: evicts 2, its LRU
    assert list(cache.l1.blocks) == [3, 5]
    assert list(cache.l2.blocks) == [1, 4, 3, 5]
    assert cache.lookup([1, 2], 8) == Hit(0, 4)
    assert cache.lookup([3, 4], 8) == Hit(4, 3)


def test_l2_never_evicts_a_block_held_in_l1():
    cache = make(l1=12, l2=15)
    cache.insert([1], 4)
    cache.insert([2], 4)
    cache.insert([3], 3)  # partial block: L1 holds 11 of 12 tokens
    cache.insert([4], 4)  # L1 evicts 1 -> L1 = 2, 3, 4 (11); L2 = 1, 2, 3, 4 (15, full)
    assert cache.lookup([1], 4) == Hit(0, 3)  # touches 1 in L2: L2 = 2, 3, 4, 1
    cache.insert([6], 1)  # fits L1 (12); L2 needs 1 token: 2, 3, 4 are in L1, so 1 goes
    assert list(cache.l1.blocks) == [2, 3, 4, 6]
    assert list(cache.l2.blocks) == [2, 3, 4, 6]
    assert cache.l2.used == 12
    assert cache.lookup([1], 4) == Hit(0, 0)


def test_page_rounding_splits_tiers():
    cache = make(l1=4, l2=8, page=3)
    cache.insert([1, 2], 8)  # L1 keeps the prefix block 1 only; L2 has 1 and 2
    assert list(cache.l1.blocks) == [1]
    # L1 run 4 -> 3; L1 + L2 run 8 -> 6; so L2 gets 3
    assert cache.lookup([1, 2, 3], 10) == Hit(3, 3)


def test_a_request_longer_than_l1_keeps_its_leading_blocks():
    cache = make(l1=8, l2=None)
    cache.insert([1, 2, 3, 4], 16)
    assert list(cache.l1.blocks) == [2, 1]
    assert cache.lookup([1, 2, 3, 4], 16) == Hit(8, 7)


def test_capacities_and_their_errors():
    assert CacheConfig(100, None, 2.5).capacities() == (100, 250)
    assert CacheConfig(None, None, 2.0).capacities() == (None, None)
    assert CacheConfig(100, 0).capacities() == (100, 0)
    assert make(l1=100, l2=0).l2 is None
    assert CacheConfig(100, 120, 2.0).capacities() == (100, 120)  # absolute wins, as in SGLang
    with pytest.raises(ConfigError, match=r"l2_tokens: 50 is smaller than l1_tokens=100"):
        CacheConfig(100, 50).capacities()
    with pytest.raises(ConfigError, match=r"l1_tokens=null \(unlimited\)"):
        CacheConfig(None, 50).capacities()
    with pytest.raises(
        ConfigError, match=r"hicache_ratio: must be null or a number >= 1 .* got 0.5"
    ):
        CacheConfig(100, None, 0.5).capacities()
    with pytest.raises(ConfigError, match=r"page_size: must be an integer >= 1, got 0"):
        CacheConfig(page_size=0).capacities()
    with pytest.raises(
        ConfigError, match=r"l1_tokens: must be null \(unlimited\) or an integer >= 0, got -1"
    ):
        make(l1=-1)
