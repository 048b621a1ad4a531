"""Load-back paths the other tests do not reach: an L2 hit of exactly the threshold on the
slow path (a quota set, or eviction needed), and the ``no_room`` outcome. Expectations by hand.

``_load_back`` declines a hit ``H < max(1, load_back_threshold)`` (``below_threshold``) and
one above the quota (``over_quota``); otherwise, when fewer than ``H`` slots are free, it
evicts unlocked nodes (the other cache, then the prefixes of the requests waiting behind)
and declines with ``no_room`` if they are still too few.
"""

from __future__ import annotations

from cpkv.admission.budgets import AdmitBudgets, CpBudgets
from cpkv.admission.ticks import run_admission
from cpkv.workload.request import Request, RunningDecode


def run(requests, **budgets):
    budgets.setdefault("cp", CpBudgets(enabled=False))
    budgets.setdefault("max_new_tokens", 0)
    return run_admission(requests, AdmitBudgets(**budgets))


def test_a_hit_of_exactly_the_threshold_loads_on_the_quota_path() -> None:
    # a quota (10) sends every load-back down the slow path; H = 10 = threshold is not below
    # it and not above the quota: loaded; H = 9 is below: recomputed (prefix 0, 9 + 1 new)
    (t,) = run([Request("r0", 0, 10, 1)], available_tokens=1000, load_back_quota_tokens=10).ticks
    (ev,) = t.load_back_events
    assert (ev.outcome, ev.loaded_tokens, ev.evicted_tokens) == ("loaded", 10, 0)
    assert (ev.available_before_tokens, ev.available_after_tokens) == (1000, 990)
    assert [(a.prefix_tokens, a.extend_tokens) for a in t.accepted] == [(10, 1)]
    (t,) = run([Request("r0", 0, 9, 1)], available_tokens=1000, load_back_quota_tokens=10).ticks
    assert [e.outcome for e in t.load_back_events] == ["below_threshold"]
    assert [(a.prefix_tokens, a.extend_tokens) for a in t.accepted] == [(0, 10)]


def test_a_hit_of_exactly_the_threshold_loads_after_evicting() -> None:
    # 5 free < H = 10 = threshold: the other cache's 100-token node is evicted whole (105
    # free), then 10 are loaded: 95 left
    (t,) = run([Request("r0", 0, 10, 1)], available_tokens=5, evictable_tokens=100).ticks
    (ev,) = t.load_back_events
    assert (ev.outcome, ev.loaded_tokens, ev.evicted_tokens) == ("loaded", 10, 100)
    assert (ev.available_before_tokens, ev.available_after_tokens) == (5, 95)


def test_no_room_when_eviction_cannot_free_enough() -> None:
    # A running decode past its max_new_tokens (output 100 > max_new 0) gives SGLang's
    # headroom sum min(0 - 100, 4096) x 1.0 = -100: the memory check then passes with less
    # room than the hit needs. r0: H = 45 (>= threshold 10), 0 free; the only unlocked node
    # is r1's 35-token L1 prefix: evicted (r1's hit moves to L2), 35 free < 45 -> no_room.
    # r0 is admitted without its host hit (prefix 0, 45 + 10 computed). r1's prefix now
    # sits in L2: whenever it is admitted it asks for a 35-token load-back.
    reqs = [Request("r0", 0, 45, 10), Request("r1", 35, 0, 1)]
    running = (RunningDecode(max_new_tokens=0, output_len=100),)
    ticks = run(reqs, available_tokens=0, running=running, new_token_ratio=1.0).ticks
    e0 = ticks[0].load_back_events[0]
    assert (e0.rid, e0.outcome, e0.requested_tokens, e0.loaded_tokens) == ("r0", "no_room", 45, 0)
    assert (e0.available_before_tokens, e0.evicted_tokens, e0.available_after_tokens) == (0, 35, 35)
    assert [(a.rid, a.prefix_tokens, a.extend_tokens) for a in ticks[0].accepted][0] == (
        "r0",
        0,
        55,
    )
    later = [e for t in ticks for e in t.load_back_events if e.rid == "r1"]
    assert [(e.requested_tokens, e.evicted_tokens) for e in later][:1] == [(35, 0)]
