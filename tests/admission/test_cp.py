"""CP shared-KV limits of the model (cpkv's own step; upstream SGLang has none), by hand."""

from __future__ import annotations

import pytest

from cpkv.admission.budgets import AdmitBudgets, CpBudgets
from cpkv.admission.ticks import run_admission
from cpkv.workload.request import Request


def run(requests, cp, **budgets):
    budgets.setdefault("available_tokens", 10**6)
    return run_admission(requests, AdmitBudgets(cp=cp, **budgets))


def rids(tick):
    return [a.rid for a in tick.accepted]


def test_would_exceed_stops_the_batch():
    cp = CpBudgets(max_total_extend_tokens=1000, max_batch_requests=None)
    t0, t1 = run([Request("r0", 0, 0, 600), Request("r1", 0, 0, 600)], cp).ticks
    assert rids(t0) == ["r0"]
    assert (t0.stopped_on_rid, t0.stopped_result, t0.stopped_budget, t0.stopped_where) == (
        "r1", "OTHER", "cp_max_total_extend_tokens", "refused",
    )  # fmt: skip
    assert rids(t1) == ["r1"]


def test_a_request_alone_above_a_limit_runs_alone():
    cp = CpBudgets(
        max_total_extend_tokens=100, max_total_cached_tokens=100, max_batch_requests=None
    )
    t0, t1 = run([Request("big", 500, 0, 500), Request("small", 0, 0, 10)], cp).ticks
    assert (
        rids(t0) == ["big"]
        and t0.cp_total_extend_tokens == 500
        and t0.cp_total_cached_tokens == 500
    )
    assert t0.stopped_budget == "cp_max_total_extend_tokens"  # checked before the cached sum
    assert rids(t1) == ["small"]


def test_batch_request_limit():
    cp = CpBudgets(max_total_extend_tokens=None, max_batch_requests=2)
    ticks = run([Request(f"r{k}", 0, 0, 10) for k in range(5)], cp).ticks
    assert [rids(t) for t in ticks] == [["r0", "r1"], ["r2", "r3"], ["r4"]]
    assert ticks[0].stopped_budget == "cp_max_batch_requests" and ticks[0].cp_batch_requests == 2


def test_sums_are_page_aligned():
    # page 16: extend 10 -> 16, 40 -> 48: 64 <= 64 fits; one more token -> 80 > 64
    cp = CpBudgets(max_total_extend_tokens=64, max_batch_requests=None)
    reqs = [Request("a", 0, 0, 10), Request("b", 0, 0, 40), Request("c", 0, 0, 1)]
    t0 = run(reqs, cp, page_size=16).ticks[0]
    assert rids(t0) == ["a", "b"] and t0.cp_total_extend_tokens == 64
    assert t0.stopped_budget == "cp_max_total_extend_tokens"
    # cached sums: 32 + 32 = 64 <= 64; the third (32 more) would make 96
    cp = CpBudgets(
        max_total_extend_tokens=None, max_total_cached_tokens=64, max_batch_requests=None
    )
    reqs = [Request(f"h{k}", 40, 0, 5) for k in range(3)]  # floor_page(40) = 32 cached
    t0 = run(reqs, cp, page_size=16).ticks[0]
    assert rids(t0) == ["h0", "h1"] and t0.cp_total_cached_tokens == 64
    assert t0.stopped_budget == "cp_max_total_cached_tokens"


def test_cp_stop_comes_after_memory_and_before_load_back():
    # r1's L2 hit would be loaded, but CP stops it first: no load-back event this tick
    cp = CpBudgets(
        max_total_extend_tokens=None, max_total_cached_tokens=100, max_batch_requests=None
    )
    t0, t1 = run([Request("r0", 0, 0, 10), Request("r1", 0, 400, 10)], cp).ticks
    assert rids(t0) == ["r0"] and t0.load_back_events == ()
    assert t0.stopped_budget == "cp_max_total_cached_tokens"
    assert rids(t1) == ["r1"] and t1.load_back_events[0].loaded_tokens == 400
    # a memory refusal wins over CP: NO_TOKEN names the memory budget
    t0 = run(
        [Request("r0", 0, 0, 10, 0), Request("r1", 0, 0, 5000, 0)], cp, available_tokens=1000
    ).ticks[0]
    assert (t0.stopped_result, t0.stopped_budget) == ("NO_TOKEN", "rem_total_tokens")


def test_declined_load_back_rechecks_cp_without_the_host_hit():
    # with its 8-token L2 hit r1 adds 45 extend (50 + 45 <= 100); the hit is below the
    # threshold, so it is recomputed: 53 extend -> 103 > 100 stops the batch after the event
    cp = CpBudgets(max_total_extend_tokens=100, max_batch_requests=None)
    t0 = run([Request("r0", 0, 0, 50), Request("r1", 0, 8, 45)], cp).ticks[0]
    assert rids(t0) == ["r0"] and t0.stopped_budget == "cp_max_total_extend_tokens"
    (ev,) = t0.load_back_events
    assert (ev.rid, ev.outcome, ev.loaded_tokens) == ("r1", "below_threshold", 0)


def test_continuing_chunk_counts_in_the_batch():
    # r0 (1200 tokens) is cut to 1000; next tick its last 200 tokens lead the batch with
    # 1000 cached tokens: r1 (10 extend) would make 210 > 205
    cp = CpBudgets(max_total_extend_tokens=205, max_batch_requests=None)
    t0, t1, t2 = run(
        [Request("r0", 0, 0, 1200), Request("r1", 0, 0, 10)], cp, chunked_prefill_size=1000
    ).ticks
    assert rids(t0) == ["r0"] and t0.accepted[0].chunked
    assert rids(t1) == ["r0"] and t1.accepted[0].continuation
    assert (t1.cp_total_extend_tokens, t1.cp_total_cached_tokens) == (200, 1000)
    assert t1.stopped_budget == "cp_max_total_extend_tokens"
    assert rids(t2) == ["r1"]


def test_cp_disabled_or_without_limits_never_stops():
    reqs = [Request(f"r{k}", 0, 0, 1000) for k in range(12)]
    for cp in (CpBudgets(enabled=False), CpBudgets(None, None, None)):
        (t,) = run(reqs, cp, max_prefill_tokens=10**6).ticks
        assert len(t.accepted) == 12 and t.stopped_result == "queue_exhausted"


def test_seed_jsonl_example():
    # the seed's two-request JSONL with --available-tokens 200000 --cp-max-total-extend-tokens
    # 65536 --cp-max-total-cached-tokens 131072: 40320 + 32768 cached fit, extend 128 + 512
    cp = CpBudgets(max_total_extend_tokens=65536, max_total_cached_tokens=131072)
    reqs = [Request("r0", 40320, 0, 128), Request("r1", 0, 32768, 512)]
    (t,) = run(reqs, cp, available_tokens=200_000).ticks
    assert [(a.rid, a.prefix_tokens, a.extend_tokens) for a in t.accepted] == [
        ("r0", 40320, 128),
        ("r1", 32768, 512),
    ]
    assert (t.cp_total_cached_tokens, t.cp_total_extend_tokens) == (73088, 640)
    assert t.allocator_available_after_tick == 200_000 - 32768
    assert t.log_hit_tokens == 73088 and t.log_input_tokens == 640


@pytest.mark.parametrize(
    "field", ["max_total_extend_tokens", "max_total_cached_tokens", "max_batch_requests"]
)
def test_limits_must_be_positive(field):
    from cpkv.core.schema import FieldError, build

    with pytest.raises(FieldError, match=field):
        build(CpBudgets, {field: 0})
