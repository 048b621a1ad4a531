"""The prefix_aware router's approximate tree against a brute-force model of what it was told."""

from __future__ import annotations

import random
import sys

from cpkv.serving.cluster.prefix_tree import PrefixTree
from cpkv.serving.cluster.routers import RouterSettings, make_router, unique_blocks
from tests.serving.cluster.test_routers import loads, req


def common_prefix(a: tuple, b: tuple) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_matches_agree_with_a_brute_force_model() -> None:
    """Without eviction the tree holds exactly what was inserted: the match is the longest
    common prefix with any inserted sequence, the tenants at the matched node are those with
    a sequence sharing at least that much (sequences end on node boundaries), and a tenant's
    size is the number of distinct prefixes (of length >= 1) of its sequences."""
    rng = random.Random(5)
    for _ in range(30):
        tree, told = PrefixTree(3), {0: [], 1: [], 2: []}
        for step in range(40):
            seq = tuple(rng.choice("abc") for _ in range(rng.randint(0, 6)))
            if rng.random() < 0.6:
                tenant = rng.randrange(3)
                tree.insert(seq, tenant, float(step))
                told[tenant].append(seq)
                continue
            m = tree.match(seq)
            shares = {t: max((common_prefix(s, seq) for s in told[t]), default=0) for t in told}
            assert m.blocks == max(shares.values())
            if m.blocks:
                assert m.tenants == sorted(t for t in told if shares[t] >= m.blocks)
            else:
                assert m.tenants == [0, 1, 2]  # the root holds every instance
        for t in told:
            prefixes = {s[:k] for s in told[t] for k in range(1, len(s) + 1)}
            assert tree.size_blocks[t] == len(prefixes) == tree.held_blocks(t)


def test_a_partial_edge_stops_the_match() -> None:
    """abcdxy inserted: abxy shares ab only (the edge abcd is left at c; its child x must
    not be followed)."""
    tree = PrefixTree(1)
    tree.insert(tuple("abcdxy"), 0, 0.0)
    tree.insert(tuple("abcdz"), 0, 0.0)  # splits abcdxy into abcd | xy, z
    assert tree.match(tuple("abxy")).blocks == 2
    assert tree.match(tuple("abcdxq")).blocks == 5


def test_eviction_keeps_sizes_consistent_and_removes_only_the_oldest() -> None:
    rng = random.Random(9)
    tree = PrefixTree(2)
    for step in range(200):
        seq = tuple(rng.choice("abcd") for _ in range(rng.randint(1, 8)))
        tree.insert(seq, rng.randrange(2), float(step))
        if step % 25 == 24:
            tree.evict(10)
            for t in range(2):
                assert tree.size_blocks[t] == tree.held_blocks(t) <= 10


def test_a_cache_miss_refreshes_the_matched_holder() -> None:
    """As sgl-router's prefix_match, a balanced request refreshes the access time of the
    instance holding its matched prefix even when it goes elsewhere: instance 0 holds ab
    (t = 0) and cd (t = 100, sent there by the balance threshold); at t = 500 a request starting with ab (2 of 10 blocks: a miss)
    goes to instance 1 but refreshes 0's ab. At the eviction (t = 1 s, 0 holds 4 > 3 blocks)
    0's least recently used leaf is then cd, not ab."""
    r = make_router(
        "prefix_aware", RouterSettings(eviction_interval_s=1.0, max_tree_blocks=3), 2, 0
    )
    r.route(req("a", "ab"), loads(0, 0), 0.0)
    assert r.route(req("b", "cd"), loads(0, 70), 100.0).rule == "balance"
    assert r.route(req("c", "abxyzwvuts"), loads(0, 0), 500.0).instance == 1
    r.route(req("d", "qq"), loads(0, 0), 1000.0)  # the eviction runs first
    assert 0 in r.tree.match(tuple("ab")).tenants
    assert r.tree.match(tuple("cd")).blocks == 0


def test_a_request_without_prefix_information_is_held_as_a_range_and_routes_alike() -> None:
    """A request's own blocks ``(rid, i)`` are held as a range, however long its prompt (a
    prompt at the schema's bound used to take gigabytes): the keys are those of the explicit
    tuple, and a tree fed the ranges or the tuples gives the same matches, tenants, sizes and
    evictions, beside requests with trace blocks."""
    huge = unique_blocks("r", 2**22, 1)
    assert len(huge) == 2**22 and huge[0] == ("r", 0) and huge[-1] == ("r", 2**22 - 1)
    assert huge[5:7] == (("r", 5), ("r", 6)) and sys.getsizeof(huge) < 256
    assert unique_blocks("d", 5, 10) == (("d", 0),) and len(unique_blocks("e", 21, 10)) == 3
    tree = PrefixTree(2)
    tree.insert(huge, 1, 0.0)
    assert tree.size_blocks[1] == 2**22 and tree.match(huge).blocks == 2**22
    assert tree.match(unique_blocks("other", 2**22, 1)).blocks == 0
    rng = random.Random(11)
    for _ in range(20):
        ranged, explicit = PrefixTree(3), PrefixTree(3)
        for step in range(60):
            rid = f"q{rng.randrange(8)}"  # (a rid seen again: its range shared in part)
            own = unique_blocks(rid, rng.randint(1, 90), 10)
            start = rng.randrange(len(own) + 1)
            keys = own[start:] if rng.random() < 0.3 else own
            trace = tuple(rng.choice("ab") for _ in range(rng.randint(1, 3)))
            if rng.random() < 0.5:
                trace = ()  # (a request without prefix information: its range alone)
            a = keys if not trace else (*trace, *keys)
            b = tuple(keys) if not trace else (*trace, *keys)
            tenant = rng.randrange(3)
            ma, mb = ranged.match(a), explicit.match(b)
            assert (ma.blocks, ma.tenants) == (mb.blocks, mb.tenants)
            ranged.insert(a, tenant, float(step))
            explicit.insert(b, tenant, float(step))
            assert ranged.size_blocks == explicit.size_blocks
            if step % 15 == 14:
                assert ranged.evict(20) == explicit.evict(20)
                assert ranged.size_blocks == explicit.size_blocks
