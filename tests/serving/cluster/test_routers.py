"""Routers on hand-built arrival sequences: the right instance is derived by hand for each
request (the loads each router sees are written out, as the cluster driver would fill them)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from cpkv.serving.cluster.routers import (
    ROUTERS,
    InstanceLoad,
    RoutedRequest,
    RouterSettings,
    RouterStats,
    make_router,
    unique_blocks,
)

IDLE3 = [InstanceLoad()] * 3


def req(
    rid: str, blocks: str = "", prompt: int | None = None, block_tokens: int = 10
) -> RoutedRequest:
    """A request whose prompt is the given one-letter blocks (``block_tokens`` tokens each)."""
    keys = tuple(blocks)
    return RoutedRequest(rid, prompt if prompt is not None else len(keys) * block_tokens, 1, keys,
                         block_tokens)  # fmt: skip


def loads(*requests: int) -> list[InstanceLoad]:
    """Instances with these outstanding request counts (all queued)."""
    return [InstanceLoad(queued_requests=n) for n in requests]


def test_the_registry_names_every_router() -> None:
    assert ROUTERS.names() == [
        "round_robin", "random", "least_requests", "least_tokens", "prefix_aware", "power_of_two",
    ]  # fmt: skip


def test_round_robin_takes_instances_in_turn_whatever_their_load() -> None:
    r = make_router("round_robin", RouterSettings(), 3, seed=0)
    busy = loads(50, 0, 0)
    assert [r.route(req(f"q{i}"), busy, i).instance for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_is_seeded() -> None:
    """The documented rule: random.Random(seed).randrange(n) per request."""
    r = make_router("random", RouterSettings(), 3, seed=7)
    got = [r.route(req(f"q{i}"), IDLE3, i).instance for i in range(20)]
    rng = random.Random(7)
    assert got == [rng.randrange(3) for _ in range(20)]
    again = make_router("random", RouterSettings(), 3, seed=7)
    assert [again.route(req(f"q{i}"), IDLE3, i).instance for i in range(20)] == got
    other = make_router("random", RouterSettings(), 3, seed=8)
    assert [other.route(req(f"q{i}"), IDLE3, i).instance for i in range(20)] != got
    spread = Counter(r.route(req("x"), IDLE3, 0).instance for _ in range(3000))
    assert all(900 <= spread[i] <= 1100 for i in range(3))  # uniform: 1000 each, +-10%


def test_least_requests_follows_the_outstanding_counts() -> None:
    """The driver adds each routed request to its instance's queue (hand-updated below)."""
    r = make_router("least_requests", RouterSettings(), 3, seed=0)
    state = [InstanceLoad(2, 1), InstanceLoad(0, 2), InstanceLoad(1, 1)]  # 3, 2, 2 outstanding
    expected = [
        1,  # 3, 2, 2: instance 1 (the lower of the tied 1 and 2) -> 3, 3, 2
        2,  # 3, 3, 2 -> 3, 3, 3
        0,  # all 3: the lowest index -> 4, 3, 3
        1,  # 4, 3, 3 -> 4, 4, 3
    ]
    for i, want in enumerate(expected):
        d = r.route(req(f"q{i}"), state, float(i))
        assert (d.instance, d.rule) == (want, "least_requests")
        x = state[d.instance]
        state[d.instance] = InstanceLoad(x.queued_requests + 1, x.running_requests)


def test_least_tokens_counts_queued_and_running_tokens_not_requests() -> None:
    """Outstanding tokens 100 + 50 = 150, 0 + 200 = 200, 120 + 0 = 120: instance 2; the same
    snapshot by requests (1 + 1, 0 + 1, 1 + 0) goes to instance 1."""
    snapshot = [InstanceLoad(1, 1, 100, 50), InstanceLoad(0, 1, 0, 200), InstanceLoad(1, 0, 120, 0)]
    tokens = make_router("least_tokens", RouterSettings(), 3, seed=0)
    requests = make_router("least_requests", RouterSettings(), 3, seed=0)
    assert tokens.route(req("a"), snapshot, 0).instance == 2
    assert requests.route(req("a"), snapshot, 0).instance == 1
    # a request of 40 tokens routed to 2 (queued): 160 vs 150 and 200 -> the next goes to 0
    snapshot[2] = InstanceLoad(2, 0, 160, 0)
    assert tokens.route(req("b"), snapshot, 1).instance == 0


def test_power_of_two_takes_the_less_loaded_of_two_drawn() -> None:
    """Two instances: both are always drawn, so the less loaded one wins whatever the draw."""
    r = make_router("power_of_two", RouterSettings(), 2, seed=3)
    assert {r.route(req(f"q{i}"), loads(5, 3), i).instance for i in range(50)} == {1}
    assert {r.route(req(f"q{i}"), loads(2, 9), i).instance for i in range(50)} == {0}
    # loads 0, 1, 2, 3: the chosen one is the smaller of a uniformly drawn pair, so instance
    # k wins the pairs with every larger one: P = 3/6, 2/6, 1/6, 0 (of the 6 pairs)
    r4 = make_router("power_of_two", RouterSettings(), 4, seed=11)
    spread = Counter(r4.route(req("x"), loads(0, 1, 2, 3), 0).instance for _ in range(6000))
    assert spread[3] == 0
    for k, share in ((0, 3 / 6), (1, 2 / 6), (2, 1 / 6)):
        assert abs(spread[k] / 6000 - share) < 0.03
    # a tie goes to the first drawn: the documented rule with the same generator
    rng = random.Random(11)
    r4 = make_router("power_of_two", RouterSettings(), 4, seed=11)
    for i in range(20):
        first, _ = rng.sample(range(4), 2)
        assert r4.route(req(f"t{i}"), loads(1, 1, 1, 1), i).instance == first


def test_one_instance_always_gets_the_request() -> None:
    for name in ROUTERS.names():
        r = make_router(name, RouterSettings(), 1, seed=0)
        assert {r.route(req(f"q{i}", "ab"), loads(i), i).instance for i in range(5)} == {0}


def test_prefix_aware_on_a_hand_built_sequence() -> None:
    """3 instances, 10 tokens per block, cache_threshold 0.3, loads balanced unless said.
    Tree sizes (blocks per instance) are tracked by hand in the comments."""
    r = make_router("prefix_aware", RouterSettings(), 3, seed=0)
    steps = [
        # (request, loads, expected instance, rule, moved, matched tokens)
        # empty tree: nothing matches (rate 0) -> the smallest tree, all 0 -> instance 0;
        # sizes 4, 0, 0
        (req("r1", "abcd"), IDLE3, 0, "cache_miss", False, 0),
        # a, b of edge abcd match (20 of 40 tokens = 0.5 > 0.3) -> its holder 0; the edge
        # splits ab | cd, xy is new: sizes 6, 0, 0
        (req("r2", "abxy"), IDLE3, 0, "cache_hit", False, 20),
        # nothing matches -> smallest tree: instance 1 (0 blocks; 2 also has 0, 1 is lower);
        # sizes 6, 3, 0
        (req("r3", "efg"), IDLE3, 1, "cache_miss", False, 0),
        # e, f match (20 of 100 tokens = 0.2 <= 0.3) -> smallest tree: instance 2;
        # efg splits ef | g, instance 2 holds ef (+2) and the new hijklmno (+8): 6, 3, 10
        (req("r4", "efhijklmno"), IDLE3, 2, "cache_miss", False, 20),
        # e f h i j k: ef, then 4 of hijklmno: 60 of 60 tokens -> its holder, instance 2
        (req("r5", "efhijk"), IDLE3, 2, "cache_hit", False, 60),
        # loads 10, 80, 5: 80 - 5 = 75 > 64 and 80 > 5 x 1.5: imbalanced -> least loaded, 2;
        # the cache rule would say 0 (abcd, all 40 tokens): moved. 2 now holds ab, cd: 6, 3, 14
        (req("r6", "abcd"), loads(10, 80, 5), 2, "balance", True, 40),
        # loads 200, 290, 200: 90 > 64 but 290 <= 200 x 1.5: balanced -> cache: ab, cd held
        # by 0 and 2, the lowest is 0
        (req("r7", "abcd"), loads(200, 290, 200), 0, "cache_hit", False, 40),
        # loads 100, 160, 100: 160 > 150 but 60 <= 64: balanced -> cache miss (nothing
        # matches) -> smallest tree: instance 1 (3 blocks); 6, 5, 14
        (req("r8", "zz"), loads(100, 160, 100), 1, "cache_miss", False, 0),
        # imbalanced (0, 70, 70): least loaded 0, and the cache rule (efg: held by 1) says 1:
        # moved
        (req("r9", "efg"), loads(0, 70, 70), 0, "balance", True, 30),
        # imbalanced (0, 70, 70) and the cache rule also says 0 (abxy): not moved
        (req("r10", "abxy"), loads(0, 70, 70), 0, "balance", False, 40),
    ]
    stats = RouterStats(3)
    for k, (request, snapshot, instance, rule, moved, matched) in enumerate(steps):
        d = r.route(request, snapshot, float(k))
        assert (d.instance, d.rule, d.moved, d.matched_tokens) == (
            instance,
            rule,
            moved,
            matched,
        ), request.rid
        stats.record(d)
    assert r.tree.size_blocks == [6 + 3, 5, 14]  # r9: 0 holds ef, g (+3)
    assert stats.moved_by_balance == 2
    assert stats.by_rule == {"cache_miss": 4, "cache_hit": 3, "balance": 3}
    assert stats.per_instance == [5, 2, 3]


def test_prefix_aware_thresholds_come_from_the_settings() -> None:
    """cache_threshold 0.6: a half match (0.5) is a miss; balance_abs_threshold 0 and
    balance_rel_threshold 1: any difference in load is an imbalance."""
    tight = RouterSettings(cache_threshold=0.6)
    r = make_router("prefix_aware", tight, 2, seed=0)
    assert r.route(req("a", "abcd"), loads(0, 0), 0).instance == 0  # miss, sizes 0 0 -> 0
    d = r.route(req("b", "abxy"), loads(0, 0), 1)  # 0.5 <= 0.6: miss -> smallest tree, 1
    assert (d.instance, d.rule) == (1, "cache_miss")
    eager = make_router(
        "prefix_aware", RouterSettings(balance_abs_threshold=0, balance_rel_threshold=1.0), 2, 0
    )
    eager.route(req("a", "abcd"), loads(0, 0), 0)
    d = eager.route(req("b", "abcd"), loads(1, 0), 1)  # 1 - 0 > 0 and 1 > 0 x 1
    assert (d.instance, d.rule, d.moved) == (1, "balance", True)


def test_requests_without_prefix_information_spread_by_tree_size() -> None:
    """Unique blocks never match: each request goes to the smallest tree, which its blocks
    then grow: prompts 30, 10, 20, 5 tokens (10-token blocks: 3, 1, 2, 1 blocks) go to
    0 (0,0,0), 1 (3,0,0), 2 (3,1,0), 1 (3,1,2)."""
    r = make_router("prefix_aware", RouterSettings(), 3, seed=0)
    got = []
    for rid, prompt in (("a", 30), ("b", 10), ("c", 20), ("d", 5)):
        request = RoutedRequest(rid, prompt, 1, unique_blocks(rid, prompt, 10), 10)
        got.append(r.route(request, IDLE3, 0).instance)
    assert got == [0, 1, 2, 1]
    assert unique_blocks("d", 5, 10) == (("d", 0),) and len(unique_blocks("e", 21, 10)) == 3


def test_prefix_aware_evicts_least_recently_used_prefixes() -> None:
    """max_tree_blocks 3, every 1 s: at t = 1 s instance 0 holds ab (t = 0) and cd (t = 0.1 s),
    4 blocks > 3, so its least recently used leaf ab goes; cd stays."""
    r = make_router(
        "prefix_aware", RouterSettings(eviction_interval_s=1.0, max_tree_blocks=3), 1, 0
    )
    r.route(req("a", "ab"), loads(0), 0.0)
    r.route(req("b", "cd"), loads(0), 100.0)
    assert r.tree.size_blocks == [4]
    d = r.route(req("c", "ab"), loads(0), 1000.0)  # evicted first: no match any more
    assert (d.rule, d.matched_tokens) == ("cache_miss", 0)
    assert r.route(req("d", "cd"), loads(0), 1001.0).matched_tokens == 20
    # the next eviction is at 2 s: sizes 4 again (ab re-inserted at 1 s), cd refreshed at
    # 1.001 s, so ab (1 s) is the least recent
    r.route(req("e", "zz"), loads(0), 2500.0)
    assert r.tree.match(tuple("ab")).blocks == 0 and r.tree.match(tuple("cd")).blocks == 2


@pytest.mark.parametrize("name", ["round_robin", "least_requests", "prefix_aware"])
def test_a_router_never_reads_the_request_id(name: str) -> None:
    """Same prompts, other ids: same decisions (no hidden dependence on names)."""
    a = make_router(name, RouterSettings(), 3, seed=0)
    b = make_router(name, RouterSettings(), 3, seed=0)
    for i, blocks in enumerate(["abc", "abd", "xyz", "abc"]):
        snapshot = loads(i % 2, 0, 1)
        assert a.route(req(f"q{i}", blocks), snapshot, i) == b.route(
            req(f"z{i}", blocks), snapshot, i
        )
