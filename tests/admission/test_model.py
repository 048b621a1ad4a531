"""The PrefillAdder model on hand-derived cases.

Most cases are the demo table of shared/reference/sglang_admission_semantics.md (section 14),
whose results were produced by the real sglang 0.5.23 PrefillAdder and checked by hand; the
expected numbers below are re-derived in the comments. CP limits are off unless a test is
about them (the real PrefillAdder has none).
"""

from __future__ import annotations

from cpkv.admission.budgets import AdmitBudgets, CpBudgets
from cpkv.admission.ticks import run_admission
from cpkv.workload.request import Request, RunningDecode

NO_CP = CpBudgets(enabled=False)


def run(requests, **budgets):
    budgets.setdefault("cp", NO_CP)
    return run_admission(requests, AdmitBudgets(**budgets))


def shape(tick):
    """(rid, prefix, extend, chunked) of each accepted request."""
    return [(a.rid, a.prefix_tokens, a.extend_tokens, a.chunked) for a in tick.accepted]


def test_fits_all():
    # 4096 - 3 x (100 extend + 1 page + 50 max_new) = 3643
    reqs = [Request(f"r{k}", 0, 0, 100, 50) for k in range(3)]
    (t,) = run(reqs, available_tokens=4096).ticks
    assert shape(t) == [("r0", 0, 100, False), ("r1", 0, 100, False), ("r2", 0, 100, False)]
    assert (t.stopped_result, t.stopped_budget, t.stopped_on_rid) == ("queue_exhausted", None, None)
    assert t.rem_total_tokens == 3643
    assert t.log_input_tokens == 300 and t.log_hit_tokens == 0


def test_no_token_then_next_tick():
    # each request reserves 300 + 1 + 100 = 401; after two, 1024 - 802 = 222 <= 401 -> NO_TOKEN
    reqs = [Request(f"r{k}", 0, 0, 300, 100) for k in range(4)]
    t0, t1 = run(reqs, available_tokens=1024).ticks
    assert [a.rid for a in t0.accepted] == ["r0", "r1"]
    assert (t0.stopped_on_rid, t0.stopped_result, t0.stopped_budget, t0.stopped_where) == (
        "r2", "NO_TOKEN", "rem_total_tokens", "refused",
    )  # fmt: skip
    assert t0.rem_total_tokens == 222
    # nothing is released or allocated between ticks: a fresh pass admits the other two
    assert [a.rid for a in t1.accepted] == ["r2", "r3"] and t1.rem_total_tokens == 222


def test_compute_cap_without_chunking():
    # max_prefill 1000: 400 + 400 leave 200; the third needs ceil(400) >= 200 -> OTHER
    reqs = [Request(f"r{k}", 0, 0, 400, 10) for k in range(4)]
    t0 = run(reqs, available_tokens=100_000, max_prefill_tokens=1000).ticks[0]
    assert [a.rid for a in t0.accepted] == ["r0", "r1"]
    assert (t0.stopped_result, t0.stopped_budget, t0.rem_input_tokens) == (
        "OTHER",
        "rem_input_tokens",
        200,
    )


def test_first_request_may_exceed_compute_cap():
    # without chunking the first request is admitted even above max_prefill_tokens
    t0 = run(
        [Request("big", 0, 0, 3000, 10), Request("r1", 0, 0, 10, 10)],
        max_prefill_tokens=1000,
        available_tokens=10**6,
    ).ticks[0]
    assert shape(t0) == [("big", 0, 3000, False)]
    assert (t0.stopped_result, t0.stopped_where, t0.stopped_budget) == (
        "OTHER",
        "after_admit",
        "rem_input_tokens",
    )
    assert t0.rem_input_tokens == -2000 and t0.stopped_on_rid == "r1"


def test_chunked_prefill_cuts_one_request_and_continues():
    # chunk 1000: 600 whole, the next cut to 400 (rem_chunk 0 -> stop after admit)
    reqs = [Request(f"r{k}", 0, 0, 600, 10) for k in range(3)]
    t0, t1 = run(reqs, available_tokens=100_000, chunked_prefill_size=1000).ticks
    assert shape(t0) == [("r0", 0, 600, False), ("r1", 0, 400, True)]
    assert (t0.stopped_result, t0.stopped_where, t0.stopped_budget, t0.stopped_on_rid) == (
        "OTHER", "after_admit", "rem_chunk_tokens", "r2",
    )  # fmt: skip
    assert t0.rem_chunk_tokens == 0
    # next tick: r1's last 200 tokens (a continuation, prefix = the 400 computed) then r2
    assert shape(t1) == [("r1", 400, 200, False), ("r2", 0, 600, False)]
    assert [a.continuation for a in t1.accepted] == [True, False]
    assert t1.rem_chunk_tokens == 200 and t1.log_hit_tokens == 0  # a continuation adds no hit


def test_paged_chunking_floors_the_cut():
    # page 16, chunk 1000: 601 is charged ceil = 608; 392 left -> cut floor 384; 8 left:
    # the next cut is floor(8 / 16) = 0 tokens -> OTHER on r2
    reqs = [Request(f"r{k}", 0, 0, 601, 10) for k in range(3)]
    t0 = run(reqs, available_tokens=100_000, chunked_prefill_size=1000, page_size=16).ticks[0]
    assert shape(t0) == [("r0", 0, 601, False), ("r1", 0, 384, True)]
    assert (t0.stopped_on_rid, t0.stopped_result, t0.stopped_budget) == (
        "r2",
        "OTHER",
        "rem_chunk_tokens",
    )
    assert t0.rem_chunk_tokens == 8 and t0.log_input_tokens == 985  # raw, not page-ceiled


def test_page_ceil_cuts_a_prompt_that_fits_raw():
    # ceil_page(1000) = 1008 > 1000 -> cut to 992, the last 8 in the next tick
    t0, t1 = run(
        [Request("r0", 0, 0, 1000, 10)],
        page_size=16,
        chunked_prefill_size=1000,
        available_tokens=10**5,
    ).ticks
    assert shape(t0) == [("r0", 0, 992, True)] and shape(t1) == [("r0", 992, 8, False)]


def test_device_hit_is_locked_for_its_own_check():
    # 512 cached tokens are evictable until r0 is admitted; 3584 free:
    # 3584 - (188 + 1 + 32) - (200 + 1 + 32) = 3130
    reqs = [Request("r0", 512, 0, 188, 32), Request("r1", 0, 0, 200, 32)]
    (t,) = run(reqs, available_tokens=3584).ticks
    assert shape(t) == [("r0", 512, 188, False), ("r1", 0, 200, False)]
    assert (t.log_hit_tokens, t.log_input_tokens, t.rem_total_tokens) == (512, 388, 3130)
    assert t.evictable_after_tick == 0  # r0 locked its prefix


def test_l2_hit_is_loaded_back_and_takes_slots():
    # 400 L2 tokens take 400 slots now; 1648 - (100+1+50) - (200+1+50) = 1246
    reqs = [Request("r0", 0, 400, 100, 50), Request("r1", 0, 0, 200, 50)]
    (t,) = run(reqs, available_tokens=2048).ticks
    assert shape(t) == [("r0", 400, 100, False), ("r1", 0, 200, False)]
    assert t.accepted[0].loaded_tokens == 400 and t.allocator_available_after_tick == 1648
    assert t.rem_total_tokens == 1246
    (ev,) = t.load_back_events
    assert (ev.rid, ev.requested_tokens, ev.paged_tokens, ev.loaded_tokens) == ("r0", 400, 400, 400)
    assert (ev.available_before_tokens, ev.available_after_tokens, ev.outcome) == (
        2048,
        1648,
        "loaded",
    )


def test_l1_and_l2_hit():
    # 256 on device + 144 on host: 1792 free -> 1648; rem 1648 - 151 = 1497
    (t,) = run([Request("r0", 256, 144, 100, 50)], available_tokens=1792).ticks
    assert shape(t) == [("r0", 400, 100, False)] and t.accepted[0].loaded_tokens == 144
    assert t.allocator_available_after_tick == 1648 and t.rem_total_tokens == 1497


def test_l2_hit_below_threshold_is_recomputed():
    # 8 < 10: declined, the 8 tokens are computed: p0 + e100, hit 0
    (t,) = run([Request("r0", 0, 8, 92, 50)], available_tokens=2048).ticks
    assert shape(t) == [("r0", 0, 100, False)] and t.log_hit_tokens == 0
    (ev,) = t.load_back_events
    assert (ev.loaded_tokens, ev.outcome, ev.available_after_tokens) == (0, "below_threshold", 2048)
    assert t.rem_total_tokens == 2048 - 151


def test_running_decodes_reserve_headroom():
    # 2 x min(2000, 4096) x 0.7 = 2800 reserved; r0 takes 1001: 4096 - 3801 = 295.0 left
    reqs = [Request(f"r{k}", 0, 0, 500, 500) for k in range(3)]
    running = (RunningDecode(2000, 0), RunningDecode(2000, 0))
    t0 = run(reqs, available_tokens=4096, running=running, new_token_ratio=0.7).ticks[0]
    assert [a.rid for a in t0.accepted] == ["r0"] and t0.stopped_result == "NO_TOKEN"
    assert t0.rem_total_tokens == 295.0 and isinstance(t0.rem_total_tokens, float)


def test_max_new_tokens_is_clipped_to_4096():
    # reserve 100 + 1 + min(10000, 4096) = 4197
    (t,) = run([Request("r0", 0, 0, 100, 10_000)], available_tokens=10_000).ticks
    assert t.rem_total_tokens == 10_000 - 4197


def test_chunk_continuation_over_three_ticks():
    # 2500 tokens, chunk 1000; a computed chunk is not charged to the allocator (seed model)
    reqs = [Request("big", 0, 0, 2500, 64), Request("small", 0, 0, 300, 64)]
    t0, t1, t2 = run(reqs, available_tokens=8192, chunked_prefill_size=1000).ticks
    assert shape(t0) == [("big", 0, 1000, True)] and t0.rem_total_tokens == 8192 - 1001
    assert shape(t1) == [("big", 1000, 1000, True)]
    assert (t1.stopped_where, t1.stopped_result, t1.stopped_budget, t1.stopped_on_rid) == (
        "scan_top", "OTHER", "rem_chunk_tokens", "small",
    )  # fmt: skip
    assert shape(t2) == [("big", 2000, 500, False), ("small", 0, 300, False)]
    assert t2.rem_chunk_tokens == 200 and t2.rem_total_tokens == 8192 - 565 - 365


def test_l2_hit_counts_as_needing_slots():
    # 800 L2 + 200 new + 100 max_new + 1 page = 1101 >= 1024: nothing admitted, run stops
    (t,) = run([Request("r0", 0, 800, 200, 100)], available_tokens=1024).ticks
    assert t.accepted == () and (t.stopped_result, t.stopped_where) == ("NO_TOKEN", "refused")
    assert t.load_back_events == ()


def test_whole_l2_hit_is_loaded_for_the_first_chunk():
    (t0, t1, t2) = run(
        [Request("r0", 0, 400, 600, 10)], available_tokens=4096, chunked_prefill_size=256
    ).ticks
    assert shape(t0) == [("r0", 400, 256, True)] and t0.accepted[0].loaded_tokens == 400
    assert shape(t1) == [("r0", 656, 256, True)] and shape(t2) == [("r0", 912, 88, False)]


def test_max_running_requests_fills_the_batch():
    # 4 - 2 running = room for 2 new requests per tick
    reqs = [Request(f"r{k}", 0, 0, 10, 10) for k in range(3)]
    t0, t1 = run(reqs, max_running_requests=4, running=(RunningDecode(10, 0),) * 2).ticks
    assert [a.rid for a in t0.accepted] == ["r0", "r1"]
    assert (t0.stopped_result, t0.stopped_budget, t0.stopped_on_rid) == (
        "batch_full",
        "max_running_requests",
        "r2",
    )
    assert [a.rid for a in t1.accepted] == ["r2"]


def test_prefill_max_requests():
    reqs = [Request(f"r{k}", 0, 0, 10, 10) for k in range(3)]
    t0 = run(reqs, prefill_max_requests=2).ticks[0]
    assert [a.rid for a in t0.accepted] == ["r0", "r1"]
    assert (t0.stopped_result, t0.stopped_budget, t0.stopped_where) == (
        "OTHER",
        "prefill_max_requests",
        "refused",
    )


def test_non_aligned_hits_use_whole_pages():
    # page 16: D = floor(20) = 16; D + H = floor(20 + 30) = 48 -> H = 32; L = 60, E = 12
    (t,) = run([Request("r0", 20, 30, 10, 0)], page_size=16, available_tokens=1024).ticks
    assert shape(t) == [("r0", 48, 12, False)] and t.accepted[0].loaded_tokens == 32


def test_seed_grid_defaults():
    # default budgets: 20000 free, the four 4096-token L1 prefixes evictable (36384 in all);
    # g7 (4096 L1 + 4096 L2 + 2048) needs 6273 < 11808 - 4096 - 7559 = 153: NO_TOKEN
    from cpkv.workload.sources import WorkloadSpec, load_workload

    t0, t1 = run_admission(load_workload(WorkloadSpec()), AdmitBudgets()).ticks
    assert [a.rid for a in t0.accepted][-1] == "g6_4096_4096_128" and len(t0.accepted) == 7
    assert (t0.stopped_on_rid, t0.stopped_result) == ("g7_4096_4096_2048", "NO_TOKEN")
    assert t0.rem_total_tokens == 11808 - 7559 and t0.allocator_available_after_tick == 7712
    assert t0.cp_total_extend_tokens == 6656 and t0.log_hit_tokens == 24576
    assert [a.rid for a in t1.accepted] == ["g7_4096_4096_2048"]


def test_boundaries_strict_and_non_strict():
    # memory: admit only if (L - D) + max_new + page < rem_total (strict)
    (t,) = run([Request("r0", 0, 0, 899, 100)], available_tokens=1000).ticks
    assert t.accepted == () and t.stopped_result == "NO_TOKEN"  # 1000 < 1000 fails
    (t,) = run([Request("r0", 0, 0, 898, 100)], available_tokens=1000).ticks
    assert len(t.accepted) == 1 and t.rem_total_tokens == 1
    # compute cap without chunking: refused when ceil(E) >= rem_input
    t0 = run([Request("r0", 0, 0, 500), Request("r1", 0, 0, 500)], max_prefill_tokens=1000).ticks[0]
    assert [a.rid for a in t0.accepted] == ["r0"] and t0.stopped_budget == "rem_input_tokens"
    # chunking: a request with ceil(E) == rem_chunk is not cut; then rem_chunk = 0 stops
    t0 = run([Request("r0", 0, 0, 1000), Request("r1", 0, 0, 5)], chunked_prefill_size=1000).ticks[
        0
    ]
    assert shape(t0) == [("r0", 0, 1000, False)]
    assert (t0.stopped_where, t0.stopped_budget, t0.stopped_on_rid) == (
        "after_admit",
        "rem_chunk_tokens",
        "r1",
    )


def test_scan_top_names_rem_input_before_rem_chunk():
    # the continuing chunk spends max_prefill_tokens and the chunk budget at once: budget_state
    # checks rem_input first
    ticks = run(
        [Request("r0", 0, 0, 2500), Request("r1", 0, 0, 5)],
        chunked_prefill_size=1000,
        max_prefill_tokens=1000,
    ).ticks
    assert (ticks[1].stopped_where, ticks[1].stopped_budget) == ("scan_top", "rem_input_tokens")
    assert (ticks[1].rem_input_tokens, ticks[1].rem_chunk_tokens) == (0, 0)
