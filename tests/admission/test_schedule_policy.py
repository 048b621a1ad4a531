"""SGLang's waiting-queue policies and priority preemption on small cases derived by hand.

Every expected order is written out with its reasoning; the same rules are checked against
the real sglang code in ``test_schedule_policy_oracle.py``. Block size 4 tokens unless said.
"""

from __future__ import annotations

import random

import pytest

from cpkv.admission.schedule_policy import (
    WAITING_QUEUE_PREFIX_MATCH_MAX,
    QueuedRequest,
    RunningState,
    SchedulePolicyConfig,
    WaitingPrefixTree,
    WaitingQueueOrder,
    choose_preemption,
    degenerate_note,
    preemption_need_tokens,
    resolve_priority,
    running_token_offset,
)
from cpkv.core.errors import ConfigError
from cpkv.core.schema import FieldError


def q(rid, prompt=8, *, mx=128, prio=0, entry=0.0, arrived=0, out=0, hashes=None):
    return QueuedRequest(rid, prompt, mx, prio, entry, arrived, out, hashes)


def order(policy, queue, hits=None, *, processed=0, rank=None, block=4, seed=0, **keys):
    cfg = SchedulePolicyConfig(schedule_policy=policy, **keys)
    o = WaitingQueueOrder(cfg, block_size=block, seed=seed)
    hits = hits or {}
    o.sort(queue, lambda r: hits.get(r.rid, (0, 0)), processed, rank)
    return [r.rid for r in queue]


# -- cache-agnostic ------------------------------------------------------------------------


def test_fcfs_keeps_the_queue_without_priorities():
    queue = [q("b", entry=3.0, prio=9), q("a", entry=1.0)]
    assert order("fcfs", queue) == ["b", "a"]  # no sort at all: arrival order is queue order


def test_fcfs_with_priorities_both_directions():
    def queue():
        return [q("a", prio=1, entry=2.0), q("b", prio=5, entry=3.0), q("c", prio=5, entry=1.0)]

    # larger values first: keys (-priority, entry): b (-5, 3), c (-5, 1), a (-1, 2) -> c, b, a
    assert order("fcfs", queue(), enable_priority_scheduling=True) == ["c", "b", "a"]
    # smaller values first: keys (priority, entry): a (1, 2), c (5, 1), b (5, 3)
    assert order(
        "fcfs", queue(), enable_priority_scheduling=True, schedule_low_priority_values_first=True
    ) == ["a", "c", "b"]


def test_lof_longest_max_new_first_then_priority():
    queue = [q("a", mx=10), q("b", mx=100), q("c", mx=100)]
    assert order("lof", queue) == ["b", "c", "a"]  # -max_new; b, c tie: queue order
    queue = [q("a", mx=10, prio=2), q("b", mx=100, prio=1), q("c", mx=100, prio=2)]
    # keys (-priority, -max_new): a (-2, -10), b (-1, -100), c (-2, -100) -> c, a, b
    assert order("lof", queue, enable_priority_scheduling=True) == ["c", "a", "b"]
    # max_new_tokens is the request's own, not clipped at 4096: 9000 before 5000
    assert order("lof", [q("x", mx=5000), q("y", mx=9000)]) == ["y", "x"]


def test_random_is_a_seeded_shuffle_that_carries_on():
    rids = [f"r{k}" for k in range(12)]
    cfg = SchedulePolicyConfig(schedule_policy="random")
    o = WaitingQueueOrder(cfg, seed=7)
    queue = [q(r) for r in rids]
    o.sort(queue)
    expect = list(rids)
    gen = random.Random(7)  # the same Fisher-Yates as SGLang's random.shuffle
    gen.shuffle(expect)
    assert [r.rid for r in queue] == expect != rids
    o.sort(queue)  # the second pass draws the next numbers, not the seed's again
    gen.shuffle(expect)
    assert [r.rid for r in queue] == expect
    seven, eight = [q(r) for r in rids], [q(r) for r in rids]
    WaitingQueueOrder(cfg, seed=7).sort(seven)
    WaitingQueueOrder(cfg, seed=8).sort(eight)
    assert [r.rid for r in seven] != [r.rid for r in eight]  # the seed matters


def test_resolve_priority_unset_is_least_urgent():
    assert resolve_priority(None, low_values_first=True) == 2**63 - 1  # sys.maxsize
    assert resolve_priority(None, low_values_first=False) == -(2**63)
    assert resolve_priority(4, low_values_first=True) == 4


# -- cache-aware ---------------------------------------------------------------------------


def test_lpm_longest_match_first_with_the_cap():
    queue = [q("a", 10), q("b", 10), q("c", 10), q("d", 5)]
    # a: nothing; b: D 4 + H 4 = 8; c: D 8 + H 0 = 8; d: prompt 5 cached whole, D = 5 but
    # matched = min(5, 5 - 1) = 4. Keys -0, -8, -8, -4 -> b, c (tie: queue order), d, a
    hits = {"b": (4, 4), "c": (8, 0), "d": (5, 0)}
    assert order("lpm", queue, hits) == ["b", "c", "d", "a"]


def test_lpm_in_batch_deferral_and_its_thresholds():
    # p, q share blocks 1, 2 (8 tokens); s shares nothing. With thresholds 8/8 q is deferred
    # (matches 8 >= 8 tokens of p, which was inserted): keys p 0, q inf, s 0 -> p, s, q
    def queue():
        return [q("p", 12, hashes=(1, 2, 9)), q("q", 12, hashes=(1, 2, 8)), q("s", 4, hashes=(7,))]

    keys = {"in_batch_prefix_check_threshold": 8, "in_batch_prefix_deprioritize_threshold": 8}
    assert order("lpm", queue(), **keys) == ["p", "s", "q"]
    # deprioritize threshold 9: 8 shared tokens are not enough -> nothing moves
    keys["in_batch_prefix_deprioritize_threshold"] = 9
    assert order("lpm", queue(), **keys) == ["p", "q", "s"]
    # default thresholds 32/32: 8 shared tokens are far from 32
    assert order("lpm", queue()) == ["p", "q", "s"]
    # check threshold 3: q's device prefix 4 > 3 skips the check (not deferred); p (D 0)
    # still inserted. Keys: p 0, q -4, s 0 -> q, p, s
    keys = {"in_batch_prefix_check_threshold": 3, "in_batch_prefix_deprioritize_threshold": 8}
    assert order("lpm", queue(), {"q": (4, 0)}, **keys) == ["q", "p", "s"]


def test_hrrn_token_aging():
    queue = [
        q("a", 20, arrived=0),  # waited 100 / uncached 20 = 5.0
        q("b", 10, arrived=50),  # waited 50 / uncached 10 = 5.0 (tie: rid order, a < b)
        q("c", 8, arrived=0),  # cached 4: 100 / 4 = 25.0 -> first
        q("d", 8, arrived=200, out=3),  # arrived after: waited max(0, -100) = 0 -> 0.0
        q("e", 8, out=3),  # prompt cached whole: uncached max(0, 8 - 8) = 0 -> -inf, first
    ]
    hits = {"c": (4, 0), "e": (8, 0)}  # e: matched min(8, 8 + 3 - 1) = 8
    assert order("hrrn", queue, hits, processed=100) == ["e", "c", "a", "b", "d"]


def test_hrrn_ties_go_by_rid_string_not_queue():
    queue = [q("r9"), q("r10")]  # equal ratios (no wait): "r10" < "r9" as strings
    assert order("hrrn", queue) == ["r10", "r9"]


def test_shortest_prefill_first():
    queue = [
        q("a", 20, entry=1.0),  # work 20
        q("b", 12, entry=2.0, out=4),  # work 12 + 4 - 8 = 8 (outputs count here)
        q("c", 9, entry=0.5),  # work 9 - 1 = 8, earlier entry than b -> before b
        q("d", 6, entry=0.0),  # cached whole: work max(1, 6 - 5) = 1 -> first
    ]
    hits = {"b": (8, 0), "c": (0, 1), "d": (6, 0)}
    assert order("shortest-prefill-first", queue, hits) == ["d", "c", "b", "a"]


def test_dfs_weight_heavier_subtree_first_deepest_first():
    # device tree from cached prompts: A = blocks 1, 2, 3 (12 tokens), B = 10, 11 (8), then
    # D = 20 (4), inserted in that order (rank). Waiting: a1 ends at 5 tokens of A (block 2,
    # 1 in), a2 at 12 (end of A), b1 at 8 (end of B), b2 at 4 (end of block 10), c uncached,
    # d1 at 4 (end of 20). Weights: A 2, B 2, D 1 -> A (created first), B, D. Inside A the
    # deeper a2 before its ancestor a1; inside B b1 before b2; uncached c last.
    rank = {1: 0, 10: 1, 20: 2}.get
    queue = [
        q("a1", 14, hashes=(1, 2, 3, 4)),
        q("b1", 9, hashes=(10, 11, 12)),
        q("b2", 6, hashes=(10, 13)),
        q("c", 4, hashes=(30,)),
        q("a2", 13, hashes=(1, 2, 3, 5)),
        q("d1", 6, hashes=(20, 21)),
    ]
    hits = {"a1": (5, 0), "a2": (12, 0), "b1": (8, 0), "b2": (4, 0), "d1": (4, 0)}
    assert order("dfs-weight", queue, hits, rank=rank) == ["a2", "a1", "b1", "b2", "d1", "c"]
    # the same with B created before A: the tie A 2 / B 2 now goes to B
    rank = {10: 0, 1: 1, 20: 2}.get
    assert order("dfs-weight", queue, hits, rank=rank) == ["b1", "b2", "a2", "a1", "d1", "c"]


def test_dfs_weight_partial_block_chain_and_private_prefixes():
    # x and y end inside block 5 (2 and 3 tokens in): y is the deeper node, first; the
    # hashless request h has its own cached prefix (a private node, rank by rid)
    queue = [q("x", 2, hashes=(5,)), q("h", 9), q("y", 3, hashes=(5,))]
    hits = {"x": (2, 0), "y": (3, 0), "h": (6, 0)}
    # weights: block 5 holds 2 requests, h's node 1 -> block 5 first
    assert order("dfs-weight", queue, hits, rank={5: 1, "h": 0}.get) == ["y", "x", "h"]


def test_lpm_and_hrrn_turn_fcfs_above_128_dfs_and_spf_do_not():
    n = WAITING_QUEUE_PREFIX_MATCH_MAX + 1
    assert n == 129

    def queue():  # reversed lengths: every sort reverses it
        return [q(f"r{k:03d}", n - k, mx=k) for k in range(n)]

    calls = []

    def match(r):
        calls.append(r.rid)
        return (0, 0)

    for policy in ("lpm", "hrrn"):
        cfg = SchedulePolicyConfig(schedule_policy=policy)
        o = WaitingQueueOrder(cfg)
        assert o.active_policy(n) == "fcfs" and o.active_policy(n - 1) == policy
        items = queue()
        o.sort(items, match)
        assert [r.rid for r in items] == [r.rid for r in queue()] and calls == []
    o = WaitingQueueOrder(SchedulePolicyConfig(schedule_policy="shortest-prefill-first"))
    items = queue()
    o.sort(items, match)  # work n - k: the last request (work 1) first
    assert [r.rid for r in items] == [r.rid for r in reversed(queue())] and len(calls) == n


def test_waiting_tree_matches_inside_blocks():
    t = WaitingPrefixTree(4)
    t.insert((1, 2, 3), 10)  # blocks 1 (4), 2 (4), 3 (2 tokens)
    assert t.match((1, 2, 3), 12) == 10  # the tree's block 3 holds 2 of my 4 tokens
    assert t.match((1, 2, 3), 9) == 9  # I hold 1 token of block 3: it matches
    assert t.match((1, 7), 8) == 4  # block 7 differs from its first token
    assert t.match(None, 8) == 0 and t.match((), 0) == 0
    t.insert((1, 2, 3, 4), 16)  # block 3 now held whole, block 4 below it
    assert t.match((1, 2, 3, 4), 14) == 14
    t.reset()
    assert t.match((1,), 4) == 0


# -- preemption ----------------------------------------------------------------------------


def run(prio, entry, mx=100, out=0, eos=False, done=False):
    return RunningState(prio, entry, mx, out, eos, done)


def test_running_offset_and_need():
    assert running_token_offset(run(0, 0.0, mx=100, out=20), 0.5) == 40.0  # (100 - 20) x 0.5
    assert running_token_offset(run(0, 0.0, mx=9000), 0.5) == 2048.0  # clipped at 4096
    assert running_token_offset(run(0, 0.0, mx=10, eos=True), 0.5) == 10.0  # ratio 1
    assert preemption_need_tokens(300, 100, 5000) == 300 - 100 + 4096
    assert preemption_need_tokens(0, 0, 7) == 7  # a request never examined: prompt unseen


def test_preemption_picks_least_urgent_latest_first():
    running = [run(5, 1.0), run(0, 1.0), run(0, 2.0), run(30, 0.5), run(0, 3.0, done=True)]
    # high values first: least urgent = lowest priority; among priority 0 the latest entry
    # (#4 finished, skipped) -> #2 (2.0), #1 (1.0), then #0 (5), #3 (30). Candidate 20
    # preempts if 20 - p > 10: #2, #1, #0 (15) yes, #3 no. Need 50 - rem 0 = 50: #2 frees
    # 100 x 0.5 = 50 -> 0: done.
    res = choose_preemption(20, 50, 0.0, running, 0.5, 10, False)
    assert res is not None and res.chosen == (2,) and res.victims == (2,)
    # need 120: #2 (50), #1 (50), #0 (50) -> -30
    res = choose_preemption(20, 120, 0.0, running, 0.5, 10, False)
    assert res.chosen == (2, 1, 0) and res.victims == (0, 1, 2)
    assert res.freed_offsets == (50.0, 50.0, 50.0)
    # need 200: all three preemptible give 150 < 200: nothing
    assert choose_preemption(20, 200, 0.0, running, 0.5, 10, False) is None
    # threshold 15: 20 - 5 = 15 is not > 15 -> only #2, #1 (100) for a need of 120: no
    assert choose_preemption(20, 120, 0.0, running, 0.5, 15, False) is None


def test_preemption_low_values_first_and_rem_total():
    running = [run(12, 1.0), run(40, 1.0), run(3, 1.0)]
    # low values first: least urgent = highest value: #1 (40), #0 (12), #2 (3). Candidate 1:
    # diff = running - 1: 39, 11 > 10 both; 2 not
    res = choose_preemption(1, 100, 0.0, running, 1.0, 10, True)
    assert res.chosen == (1,)  # 100 - 100 = 0
    # a large rem_total makes the need <= 0 at once: still one victim (the walk takes first)
    res = choose_preemption(1, 100, 500.0, running, 1.0, 10, True)
    assert res.chosen == (1,)
    assert choose_preemption(1, 100, 0.0, [run(5, 1.0)], 1.0, 10, True) is None  # 4 <= 10


# -- config --------------------------------------------------------------------------------


def test_config_validation_messages():
    SchedulePolicyConfig().validate_schedule()  # SGLang's defaults
    with pytest.raises(FieldError, match=r"unknown policy 'lmp'; did you mean 'lpm'\?"):
        SchedulePolicyConfig(schedule_policy="lmp").validate_schedule()
    with pytest.raises(FieldError, match="SchedulePolicy rejects it"):
        SchedulePolicyConfig(schedule_policy="priority").validate_schedule()
    with pytest.raises(FieldError, match="routing keys"):
        SchedulePolicyConfig(schedule_policy="routing-key").validate_schedule()
    with pytest.raises(FieldError, match="only with schedule_policy fcfs or lof, not 'lpm'"):
        SchedulePolicyConfig(
            schedule_policy="lpm", enable_priority_scheduling=True
        ).validate_schedule()
    cfg = SchedulePolicyConfig(enable_priority_scheduling=True)
    assert cfg.priority_preemption
    assert not SchedulePolicyConfig(
        enable_priority_scheduling=True, disable_priority_preemption=True
    ).priority_preemption


def test_no_prefix_cache_degenerates():
    o = WaitingQueueOrder(SchedulePolicyConfig(schedule_policy="lpm"), prefix_cache=False)
    assert o.policy == "fcfs"
    queue = [q("a", 10), q("b", 20)]
    o.sort(queue)  # fcfs: no match needed
    assert [r.rid for r in queue] == ["a", "b"]
    with pytest.raises(ConfigError, match="needs a prefix cache"):
        WaitingQueueOrder(
            SchedulePolicyConfig(schedule_policy="shortest-prefill-first"), prefix_cache=False
        )
    assert "runs as fcfs" in degenerate_note("hrrn", True, prefix_cache=False)
    assert "fixed cached tokens" in degenerate_note("lpm", has_prefix_identity=False)
    assert degenerate_note("lpm", has_prefix_identity=True) is None
    assert degenerate_note("fcfs", has_prefix_identity=False) is None


def test_admit_block_accepts_defaults_and_refuses_unapplied_values(cli) -> None:
    cases = [
        (["admit.schedule_policy=lmp"], "did you mean 'lpm'?"),
        (["admit.schedule_policy=lpm"], "is not applied in mode passes"),
        (["admit.enable_priority_scheduling=true"], "is not applied in mode passes"),
        (
            ["admit.schedule_policy=hrrn", "admit.enable_priority_scheduling=true"],
            "only with schedule_policy fcfs or lof",
        ),
    ]
    for args, message in cases:
        res = cli("admit", *args)
        assert res.exit_code == 2, (args, res.output)
        assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert cli.run_dirs() == []
    res = cli(
        "admit", "admit.schedule_policy=fcfs", "admit.priority_scheduling_preemption_threshold=3"
    )
    assert res.exit_code == 0, res.output


def test_bounded_waiting_tree_decides_deferral_like_the_whole_tree():
    """Only the blocks of the first ``threshold`` tokens are kept: ``match >= threshold``
    must come out the same as with whole prompts, on random shared paths."""
    rng = random.Random(3)
    for trial in range(300):
        block = rng.choice([1, 4, 16])
        limit = rng.choice([-1, 0, 1, 3, 4, 5, 16, 32, 40])
        whole, bounded = WaitingPrefixTree(block), WaitingPrefixTree(block, limit)
        for _ in range(12):
            hashes = tuple(rng.randint(1, 3) * 10 + k for k in range(rng.randint(1, 6)))
            prompt = (len(hashes) - 1) * block + rng.randint(1, block)
            a, b = whole.match(hashes, prompt), bounded.match(hashes, prompt)
            assert (a >= limit) == (b >= limit) and b <= a, (trial, hashes, prompt, a, b)
            if rng.random() < 0.7:
                whole.insert(hashes, prompt)
                bounded.insert(hashes, prompt)


@pytest.mark.parametrize(
    "page, heading",
    [("docs/admission.md", "## SGLang's waiting-queue policies")],
)
def test_docs_example_prints_what_it_says(capsys, page, heading):
    from tests.helpers.paths import REPO

    text = (REPO / page).read_text()
    section = text[text.index(heading) :]
    code = section[
        section.index("```python\n") + 10 : section.index("```\n", section.index("```python"))
    ]
    exec(compile(code, page, "exec"), {})
    assert capsys.readouterr().out == "['c', 'a', 'b']\n"
    assert "# ['c', 'a', 'b']" in code
