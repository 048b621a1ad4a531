"""Hand-derived serving scenarios: latencies from the cost model, preemption by growth,
queueing, goodput under SLOs, rejection, the stall guard and SGLang's adaptive ratio."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cpkv.admission.token_ratio import NewTokenRatio
from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.engine import SimulationStalled
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.engine.simulate import simulate
from cpkv.serving.input.workload import ServingRequest as R
from cpkv.serving.model.request import FINISHED, REJECTED
from cpkv.serving.record.metrics import latencies, summary_row
from cpkv.serving.schedulers.adder_pass import AdderBudgets
from cpkv.serving.schema import SloSpec

COST = CostModel(
    fixed_us=1000.0,
    prefill_token_us=2.0,
    decode_request_us=10.0,
    context_token_us=0.5,
    l2_load_gb_per_s=None,
)
FIXED_1MS = CostModel(1000.0, 0.0, 0.0, 0.0, 1, None)


def settings(policy: str = "prefill_adder", **kw) -> EngineSettings:
    base = EngineSettings(
        policy=policy,
        block_size=16,
        capacity_blocks=1000,
        budget_tokens=100_000,
        chunk_tokens=100_000,
        adder=AdderBudgets(16, 100_000, None),
        cost=COST,
    )
    return replace(base, **kw)


@pytest.mark.parametrize("policy", ["prefill_adder", "conservative", "optimistic", "iteration"])
def test_one_request_alone_ttft_and_tpot_from_the_cost_model(policy: str) -> None:
    res = simulate([R("a", 0.0, 100, 4)], settings(policy))
    (r,) = res.requests
    lat = latencies(r)
    # prefill iteration: 1000 + 2 * 100 prefill tokens + 0.5 * 100 context tokens
    assert lat["ttft"] == pytest.approx(1.25)
    # decode iterations read 101, 102, 103 context tokens: 1000 + 10 + 0.5 * ctx each
    assert lat["tpot"] == pytest.approx((1060.5 + 1061.0 + 1061.5) / 3 / 1000)
    assert lat["e2e"] == pytest.approx(1.25 + (1060.5 + 1061.0 + 1061.5) / 1000)
    assert lat["queue"] == 0.0 and r.generated == 4 and r.state == FINISHED
    assert res.iterations == 4


def test_two_requests_compete_for_kv_and_growth_preempts() -> None:
    # the seed's example (block 4, capacity 4, A(6, 6), B(4, 4)) as served, victims re-queued:
    # it0 prefill A and B (3 blocks) and B's first token takes block 4; it2 A needs a 3rd
    # block: A is preempted (kv 8) and re-queued with prompt 8; it3 A is readmitted
    # (2 blocks), its first token finds no block and A preempts itself again (kv 8) while B
    # finishes; it4 A is readmitted, gets its block; A finishes at the end of it7
    s = settings("optimistic", block_size=4, capacity_blocks=4, victim="scan_order", cost=FIXED_1MS)
    res = simulate([R("A", 0.0, 6, 6), R("B", 0.0, 4, 4)], s)
    a, b = res.requests
    assert (a.preemptions, a.recomputed, a.generated, a.finished_us) == (2, 16, 6, 8000.0)
    assert (b.preemptions, b.generated, b.finished_us) == (0, 4, 4000.0)
    assert a.first_token_us == b.first_token_us == 1000.0
    assert res.counters["preemptions"] == {"kv_growth_decode": 1, "kv_growth_first_token": 1}
    assert a.prefilled == 6 + 8 + 8  # computed three times
    row = summary_row(res, SloSpec(), 4)
    assert (row.preemptions, row.recomputed_tokens, row.finished) == (2, 16, 2)


def test_conservative_queues_instead_of_preempting() -> None:
    s = settings("conservative", block_size=4, capacity_blocks=4, cost=FIXED_1MS)
    res = simulate([R("A", 0.0, 6, 6), R("B", 0.0, 4, 4)], s)
    a, b = res.requests
    # A reserves 3 blocks, B (2) waits until A finishes at the end of iteration 5
    assert (a.admitted_us, a.finished_us, b.admitted_us) == (0.0, 6000.0, 6000.0)
    assert a.preemptions == b.preemptions == 0
    assert latencies(b)["queue"] == 6.0 and b.finished_us == 10000.0
    assert max(res.timeline[3]) == 3  # held: the reservation


def test_queue_time_behind_the_compute_budget() -> None:
    cost = CostModel(1000.0, 10.0, 0.0, 0.0, 1, None)
    s = settings(adder=AdderBudgets(16, 150, None), cost=cost)
    res = simulate([R("a", 0.0, 100, 1), R("b", 0.0, 100, 1)], s)
    a, b = res.requests
    # b's 100 tokens do not fit the 50 left of max_prefill_tokens: it waits one iteration
    # of 1000 + 10 * 100 us, then its own
    assert latencies(a)["queue"] == 0.0 and latencies(b)["queue"] == 2.0
    assert latencies(b)["ttft"] == 4.0 and res.counters["admission_stops"] == {
        "rem_input_tokens": 1
    }


def test_goodput_counts_requests_meeting_both_slos() -> None:
    cost = CostModel(1000.0, 10.0, 0.0, 0.0, 1, None)
    reqs = [R("a", 0.0, 100, 2), R("b", 100.0, 300, 2), R("c", 200.0, 500, 2)]
    res = simulate(reqs, settings(cost=cost))
    assert [latencies(r)["ttft"] for r in res.requests] == [2.0, 4.0, 6.0]
    assert [latencies(r)["tpot"] for r in res.requests] == [1.0, 1.0, 1.0]
    span = 0.207  # c finishes at 200 + 6 + 1 ms
    row = summary_row(res, SloSpec(ttft_ms=4.5, tpot_ms=2.0), 1000)
    assert row.makespan_s == pytest.approx(span)
    assert row.goodput_requests_per_s == pytest.approx(2 / span)
    assert row.slo_attainment_pct == pytest.approx(200 / 3)
    assert row.throughput_requests_per_s == pytest.approx(3 / span)
    assert row.throughput_tokens_per_s == pytest.approx(6 / span)
    assert summary_row(res, SloSpec(ttft_ms=4.5, tpot_ms=0.5), 1000).goodput_requests_per_s == 0.0
    assert summary_row(res, SloSpec(), 1000).goodput_requests_per_s == pytest.approx(3 / span)
    # linear interpolation between order statistics: rank 0.99 * 2 = 1.98
    assert row.ttft_p50_ms == 4.0 and row.ttft_p99_ms == pytest.approx(4.0 + 2.0 * 0.98)
    assert row.ttft_p99_ms == pytest.approx(float(np.percentile([2.0, 4.0, 6.0], 99)))


@pytest.mark.parametrize("policy", ["prefill_adder", "conservative", "optimistic", "iteration"])
def test_a_request_that_can_never_fit_is_rejected(policy: str) -> None:
    # 4 blocks x 4 tokens = 16 tokens: "big" needs 20 even alone; the others still run
    s = settings(policy, block_size=4, capacity_blocks=4, adder=AdderBudgets(4, 1000, None))
    res = simulate([R("big", 0.0, 12, 8), R("ok", 0.0, 4, 2)], s)
    big, ok = res.requests
    assert (big.state, big.reject_reason) == (REJECTED, "exceeds_kv_capacity")
    assert ok.state == FINISHED and res.counters["rejects"] == {"exceeds_kv_capacity": 1}


def test_a_far_too_small_pool_rejects_everything_and_ends() -> None:
    reqs = [R(f"r{k}", float(k), 100 + k, 10) for k in range(20)]
    res = simulate(reqs, settings(block_size=16, capacity_blocks=2))
    assert all(
        r.state == REJECTED and r.reject_reason == "exceeds_kv_capacity" for r in res.requests
    )
    assert res.iterations == 0


def test_a_head_that_cannot_be_admitted_into_an_idle_pool_is_a_clear_error() -> None:
    # chunked_prefill_size 8 < page 16: no chunk of a whole page ever fits
    s = settings(adder=AdderBudgets(16, 1000, 8))
    with pytest.raises(
        SimulationStalled, match="request a .*cannot be admitted even into an idle KV pool"
    ):
        simulate([R("a", 0.0, 100, 4)], s)


def test_the_ratio_decays_once_per_decoding_iteration() -> None:
    ratio = NewTokenRatio.from_settings()
    res = simulate([R("a", 0.0, 100, 50)], settings(ratio=ratio))
    # 49 decode iterations after the prefill, no retraction
    assert res.counters["final_new_token_ratio"] == pytest.approx(0.7 - 49 * (0.7 - 0.098) / 600)


def test_the_ratio_decays_before_admission_and_resets_on_retraction() -> None:
    # pool 19 tokens, page 1; ratio 0.3, min 0.042, decay 0.0258 per decode step
    ratio = NewTokenRatio.from_settings(init_ratio=0.3, decay_steps=10)
    s = settings(
        block_size=1, capacity_blocks=19, victim="least_progress", cost=FIXED_1MS, ratio=ratio
    )
    s = replace(s, adder=AdderBudgets(1, 1000, None))
    res = simulate([R("A", 1.0, 4, 7), R("B", 3.0, 4, 5)], s)
    a, b = res.requests
    # it2 (t = 3 ms): A holds 7 tokens, 3 generated, ratio after two decays 0.2484:
    # B needs 4 + 5 + 1 = 10 < 19 - 7 - 1 (A's decode) - 4 * 0.2484 = 10.0064: admitted
    # (with the undecayed 0.3 it would not be: 10 < 9.8 fails)
    assert b.admitted_us == 3000.0
    # it6: A takes the last free token; B (4 generated, fewer than A's 7) is retracted;
    # the ratio becomes min(1, (6 + 20) / (7 + 1)) over A and its 6 tokens before the step
    assert (b.preemptions, b.recomputed, a.preemptions) == (1, 8, 0)
    assert res.counters["preemptions"] == {"kv_growth_decode": 1}
    assert res.counters["final_new_token_ratio"] == 1.0
    # it7: B (prompt 4 + 4 generated) is recomputed and its last token ends it
    assert (a.finished_us, b.finished_us, b.prefilled) == (8000.0, 9000.0, 4 + 8)


def test_a_recompute_livelock_ends_with_an_error_naming_it() -> None:
    # 5 blocks of 3 tokens, 1 token of budget per iteration: while q0/q5 decode, the prompts
    # that optimistic admission lets hold blocks get no budget; the decoders' growth finds
    # no block, preempts them (the prefills are not victims), they are readmitted, and so on
    reqs = [R("q0", 0.0, 1, 3), *(R(f"q{k}", 0.0, 1, 0) for k in range(1, 5)), R("q5", 0.0, 1, 12)]
    s = settings("optimistic", block_size=3, capacity_blocks=5, budget_tokens=1, chunk_tokens=1)
    s = replace(s, stall_iterations=50, cost=FIXED_1MS)
    with pytest.raises(
        SimulationStalled, match="50 iterations without a generated token .*recompute livelock"
    ):
        simulate(reqs, s)
    # a reservation never preempts: the same workload runs to the end
    res = simulate(reqs, replace(s, policy="conservative"))
    assert [r.generated for r in res.requests] == [3, 0, 0, 0, 0, 12]
