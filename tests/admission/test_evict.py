"""Waiting prefixes as evictable room, load-back eviction (LRU) and release_each_tick, by hand."""

from __future__ import annotations

from cpkv.admission.budgets import AdmitBudgets, CpBudgets
from cpkv.admission.ticks import run_admission
from cpkv.workload.request import Request


def run(requests, **budgets):
    budgets.setdefault("cp", CpBudgets(enabled=False))
    budgets.setdefault("max_new_tokens", 0)
    return run_admission(requests, AdmitBudgets(**budgets))


def test_waiting_prefixes_count_as_room_until_admitted():
    # 50 free + r1's unlocked 100-token prefix. r_big needs 140 + 0 + 1 = 141 < 150: admitted,
    # leaving 9. r1's own prefix is locked while it is checked: 11 < 150 - 100 - 141 fails
    # (r_big borrowed that room) -> NO_TOKEN. Next tick: 11 < 150 - 100 = 50.
    reqs = [Request("r_big", 0, 0, 140), Request("r1", 100, 0, 10)]
    t0, t1 = run(reqs, available_tokens=50).ticks
    assert [a.rid for a in t0.accepted] == ["r_big"] and t0.rem_total_tokens == 9
    assert (t0.stopped_on_rid, t0.stopped_result) == ("r1", "NO_TOKEN")
    assert [(a.rid, a.prefix_tokens) for a in t1.accepted] == [("r1", 100)]
    assert t1.rem_total_tokens == 50 - 11 and t1.evictable_after_tick == 0


def test_load_back_evicts_other_cache_first_whole_node():
    # 0 free, 100 other evictable tokens: loading 50 evicts the whole 100-token node
    (t,) = run([Request("r0", 0, 50, 10)], available_tokens=0, evictable_tokens=100).ticks
    (ev,) = t.load_back_events
    assert (ev.evicted_tokens, ev.available_before_tokens, ev.available_after_tokens) == (
        100,
        0,
        50,
    )
    assert t.allocator_available_after_tick == 50 and t.evictable_after_tick == 0


def test_load_back_evicts_next_waiting_prefixes_in_queue_order():
    # 50 free; r0 loads 100 L2 tokens: evicts r1's 60-token prefix (LRU: queue order), which
    # is enough (110 >= 100). r1's hit moves to L2 (it keeps a host copy): it now loads 60,
    # evicting r2's prefix. r2 must then load 60 too: 62 > 10 - 4 free -> NO_TOKEN.
    reqs = [Request("r0", 0, 100, 1), Request("r1", 60, 0, 1), Request("r2", 60, 0, 1)]
    ticks = run(reqs, available_tokens=50).ticks
    t0 = ticks[0]
    assert [(a.rid, a.prefix_tokens, a.extend_tokens, a.loaded_tokens) for a in t0.accepted] == [
        ("r0", 100, 1, 100),
        ("r1", 60, 1, 60),
    ]
    e0, e1 = t0.load_back_events
    assert (e0.rid, e0.evicted_tokens, e0.available_before_tokens, e0.available_after_tokens) == (
        "r0",
        60,
        50,
        10,
    )
    assert (e1.rid, e1.evicted_tokens, e1.available_before_tokens, e1.available_after_tokens) == (
        "r1",
        60,
        10,
        10,
    )
    assert (t0.stopped_on_rid, t0.stopped_result) == ("r2", "NO_TOKEN")
    assert t0.rem_total_tokens == 10 - 4
    # next tick: r2 (now 60 in L2 + 1) needs 62 >= 10 free: it never runs
    assert len(ticks) == 2 and ticks[1].accepted == ()


def test_evicted_prefix_below_threshold_is_recomputed():
    # 35 free; r0 loads 40: evicts r1's 8-token prefix (enough: 43 >= 40), 3 left. r1 now
    # has an 8-token L2 hit, below the threshold: recomputed as p0 + e10 (11 < 103 - 2).
    # r2 (its 100-token prefix locked for its own check): 2 < 103 - 100 - 13 fails.
    reqs = [Request("r0", 0, 40, 1), Request("r1", 8, 0, 2), Request("r2", 100, 0, 1)]
    t0, t1 = run(reqs, available_tokens=35).ticks
    assert [(a.rid, a.prefix_tokens, a.extend_tokens) for a in t0.accepted] == [
        ("r0", 40, 1),
        ("r1", 0, 10),
    ]
    assert [(e.outcome, e.evicted_tokens) for e in t0.load_back_events] == [
        ("loaded", 8),
        ("below_threshold", 0),
    ]
    assert (t0.stopped_on_rid, t0.stopped_result) == ("r2", "NO_TOKEN")
    assert [(a.rid, a.prefix_tokens) for a in t1.accepted] == [("r2", 100)]


def test_hold_keeps_loaded_slots_release_frees_them_for_the_next_tick():
    # one request per tick; each loads 100 tokens. Hold: r0's 100 slots stay taken, r1 needs
    # 100 + 1 + 0 + 1 = 102 >= 100 left -> never runs. Release: r0's loaded node becomes
    # evictable, r1 fits (102 < 200) and loads without eviction (100 free).
    reqs = [Request("r0", 0, 100, 1), Request("r1", 0, 100, 1)]
    hold = run(reqs, available_tokens=200, prefill_max_requests=1).ticks
    assert [[a.rid for a in t.accepted] for t in hold] == [["r0"], []]
    rel = run(reqs, available_tokens=200, prefill_max_requests=1, release_each_tick=True).ticks
    assert [[a.rid for a in t.accepted] for t in rel] == [["r0"], ["r1"]]
    assert rel[1].load_back_events[0].evicted_tokens == 0
    assert rel[1].allocator_available_after_tick == 0 and rel[1].evictable_after_tick == 100


def test_release_evicts_released_nodes_last():
    # 150 free, release mode: r0 loads 100 (50 left) and finishes; its loaded node is released.
    # r1 must load 100: it evicts r2's prefix (waiting: LRU before released nodes) first:
    # 30 tokens -> 80 free, then r0's released 100-token node -> 180, then loads -> 80.
    reqs = [Request("r0", 0, 100, 1), Request("r1", 0, 100, 1), Request("r2", 30, 0, 1)]
    ticks = run(reqs, available_tokens=150, prefill_max_requests=1, release_each_tick=True).ticks
    ev = ticks[1].load_back_events[0]
    assert (ev.rid, ev.available_before_tokens, ev.evicted_tokens, ev.available_after_tokens) == (
        "r1",
        50,
        130,
        80,
    )
    # r2 lost its L1 prefix: 30 L2 tokens to load, no eviction needed
    (ev2,) = ticks[2].load_back_events
    assert (ev2.rid, ev2.requested_tokens, ev2.evicted_tokens) == ("r2", 30, 0)


def test_over_quota_is_declined():
    (t,) = run([Request("r0", 0, 100, 1)], available_tokens=1000, load_back_quota_tokens=64).ticks
    (ev,) = t.load_back_events
    assert (ev.outcome, ev.loaded_tokens, ev.quota_tokens) == ("over_quota", 0, 64)
    assert (t.accepted[0].prefix_tokens, t.accepted[0].extend_tokens) == (0, 101)
