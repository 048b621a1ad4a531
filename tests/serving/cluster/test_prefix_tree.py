"""The prefix_aware router's approximate tree against a brute-force model of what it was told."""

from __future__ import annotations

import random

from cpkv.serving.cluster.prefix_tree import PrefixTree
from cpkv.serving.cluster.routers import RouterSettings, make_router
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
