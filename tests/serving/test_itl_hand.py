"""Inter-token latency derived by hand: a prefill batch that stalls a decoding request
(SGLang's loop, mixed chunk off), a cancelled request whose gaps leave the pool (cpkv's
loop), and the statistics of known gaps (a linear cost model: fixed 1 ms an iteration, 20 µs
a prefill token, 50 µs a decoding request)."""

from __future__ import annotations

import pytest

from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.engine.sglang_engine import SglangEngine, SglangSettings
from cpkv.serving.engine.simulate import KeepRequests, simulate
from cpkv.serving.input.workload import ServingRequest
from cpkv.serving.model.request import CANCELLED, FINISHED, Req
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.serving.record.itl import itl_stats
from cpkv.serving.record.metrics import summary_row
from cpkv.serving.schedulers.adder_pass import AdderBudgets
from cpkv.serving.schedulers.options import PolicyOptions
from cpkv.serving.schema import SloSpec
from cpkv.sglang import LoopConfig

COST = CostModel(fixed_us=1000.0, prefill_token_us=20.0, decode_request_us=50.0,
                 context_token_us=0.0)  # fmt: skip


def percentile(sorted_gaps: list[float], q: float) -> float:
    rank = q / 100 * (len(sorted_gaps) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(sorted_gaps) - 1)
    return sorted_gaps[lo] + (sorted_gaps[hi] - sorted_gaps[lo]) * (rank - lo)


@pytest.mark.parametrize("stretches", [True, False])
def test_a_prefill_batch_that_stalls_a_decode_is_one_long_gap(stretches):
    # a: prompt 50, 10 tokens at 0; b: prompt 400, 2 tokens at 3 ms; mixed chunk off, no
    # overlap: a's tokens at 2.0 (its prefill: 1 ms + 50 x 20 µs) and 3.05 ms (a decode of one:
    # 1.05 ms); b's prefill runs alone from 3.05 to 12.05 ms (1 ms + 400 x 20 µs); one decode
    # of both (1.1 ms) gives a its third token and b its second at 13.15 ms; a's last 7 tokens
    # come 1.05 ms apart. a's gaps: 1.05, 10.1 (the stall), 7 x 1.05; b's: 1.1.
    config = LoopConfig(max_total_num_tokens=8192, max_running_requests=64, context_len=8192,
                        chunked_prefill_size=8192, overlap=False)  # fmt: skip
    settings = SglangSettings(config, COST)
    sink = KeepRequests()
    samples = IterationLog(settings.capacity_blocks, settings.block_size, keep=True, cost=COST)
    a, b = Req(0, "a", 0.0, 50, 10), Req(1, "b", 3000.0, 400, 2)
    SglangEngine(settings, sink=sink, samples=samples, arrivals=[a, b], stretches=stretches).run()
    assert a.finished_us == pytest.approx(13150.0 + 7 * 1050.0)
    gaps = sorted([1.05] * 8 + [10.1, 1.1])
    itl = itl_stats([samples])
    assert itl.gaps == 10
    assert itl.mean_ms == pytest.approx(sum(gaps) / 10, rel=1e-12)  # 1.96
    assert itl.p50_ms == pytest.approx(1.05, rel=1e-12)
    assert itl.p90_ms == pytest.approx(percentile(gaps, 90), rel=1e-12)  # 1.1 + 0.1 x 9.0
    assert itl.p99_ms == pytest.approx(percentile(gaps, 99), rel=1e-12)  # 1.1 + 0.91 x 9.0
    assert itl.max_ms == pytest.approx(10.1, rel=1e-12)
    # TPOT averages a's gaps (18.5 ms over 9) and keeps b's 1.1: the stall shows in no TPOT
    tpots = sorted((r.finished_us - r.first_token_us) / 1000 / (r.generated - 1) for r in (a, b))
    assert tpots == pytest.approx([1.1, 18.5 / 9])
    assert itl.p99_ms > 4 * max(tpots)


@pytest.mark.parametrize("stretches", [True, False])
def test_a_cancelled_request_leaves_no_gap(stretches):
    # x (6 tokens) and y (50, cancelled 8 ms after its arrival) arrive at 0 with 100-token
    # prompts: one iteration prefills both (1 ms + 200 x 20 µs: first tokens at 5.0 ms), then
    # both decode (1.1 ms an iteration: 6.1, 7.2, 8.3 ms); y is cancelled at the first
    # iteration boundary at or after 8 ms (8.3), x decodes alone (1.05 ms: 9.35, 10.4 ms).
    # Pooled: x's gaps only (1.1, 1.1, 1.1, 1.05, 1.05); y's three 1.1 ms gaps leave.
    requests = [
        ServingRequest("x", 0.0, 100, 6),
        ServingRequest("y", 0.0, 100, 50, cancel_ms=8.0),
    ]
    settings = EngineSettings(
        policy="prefill_adder", block_size=16, capacity_blocks=400, budget_tokens=2048,
        chunk_tokens=512, adder=AdderBudgets(16, 2048, 512), cost=COST,
        options=PolicyOptions(cancellations=True),
    )  # fmt: skip
    res = simulate(requests, settings, stretches=stretches)
    x, y = res.requests
    assert (x.state, y.state) == (FINISHED, CANCELLED)
    assert x.first_token_us == pytest.approx(5000.0) and y.finished_us == pytest.approx(8300.0)
    assert x.finished_us == pytest.approx(10400.0)
    itl = itl_stats([res.samples])
    assert itl.gaps == 5
    assert itl.mean_ms == pytest.approx((3 * 1.1 + 2 * 1.05) / 5, rel=1e-12)
    assert (itl.p50_ms, itl.p90_ms, itl.p99_ms, itl.max_ms) == pytest.approx((1.1,) * 4)
    row = summary_row(res, SloSpec(), settings.capacity_blocks)
    assert (row.itl_mean_ms, row.itl_p50_ms, row.itl_max_ms) == (
        itl.mean_ms,
        itl.p50_ms,
        itl.max_ms,
    )


def test_one_token_requests_have_no_gap():
    requests = [ServingRequest(f"r{i}", float(i), 100, 1) for i in range(5)]
    settings = EngineSettings(
        policy="prefill_adder", block_size=16, capacity_blocks=400, budget_tokens=2048,
        chunk_tokens=512, adder=AdderBudgets(16, 2048, 512), cost=COST,
    )  # fmt: skip
    res = simulate(requests, settings)
    itl = itl_stats([res.samples])
    assert itl.gaps == 0 and itl.mean_ms is None and itl.max_ms is None
    row = summary_row(res, SloSpec(), settings.capacity_blocks)
    assert row.itl_p99_ms is None and row.tpot_p99_ms is None
