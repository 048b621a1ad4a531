"""Edge paths of the serving simulation that no other test reaches, with expectations derived
here by hand: a run whose makespan is zero, a run with no iteration at all, and the running
requests' headroom when one has more than 4,096 tokens left (SGLang clips it at 4,096)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cpkv.serving.model.kv_pool import KvPool
from cpkv.serving.model.request import Req
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS
from tests.serving.test_metrics_hand import ADMIT_1, SCENARIO_1, _run

approx = pytest.approx

FREE = "  cost: {kind: linear, fixed_us: 0, prefill_token_us: 0, decode_request_us: 0, context_token_us: 0,\n"
FREE += "         kv_bytes_per_token: 1, l2_load_gb_per_s: null}\n"


def test_a_run_whose_makespan_is_zero(cli, tmp_path) -> None:
    """Scenario 1 of test_metrics_hand with every cost 0: the same 11 iterations in the same
    order (the conservative policy looks at blocks, not at time), all at t = 0.

    Per iteration (scenario 1's table), blocks used 2,2,2,3,3,2,2,3,3,3,3 (sum 28) and held
    4,4,4,4,4,3,3,3,3,3,3 (sum 38) of 4. With no time to weigh by, the means are per
    iteration: used 28 / 11 / 4 = 63.64 %, held 38 / 11 / 4 = 86.36 %; peak 3 / 4 = 75 %.
    Every latency is 0 ms; rates over a zero makespan are undefined (null), not a division by
    zero; A, B, C meet the SLO (TTFT 0 <= 5, TPOT 0 <= 1.05): 3 of 4 requests = 75 %.
    """
    admit = ADMIT_1.replace(
        "  cost: {kind: linear, fixed_us: 1000, prefill_token_us: 500, decode_request_us: 0, context_token_us: 0,\n"
        "         kv_bytes_per_token: 1, l2_load_gb_per_s: null}\n",
        FREE,
    )
    assert admit != ADMIT_1
    # every request arrives at 0 ms (no arrival_ms): trace arrivals are the zero process here
    row, _, reqs, timeline = _run(cli, tmp_path, SCENARIO_1, admit)
    assert row["makespan_s"] == 0 and row["iterations"] == 11
    assert (row["finished"], row["rejected"]) == (3, 1)
    for name in ("queue", "ttft", "tpot", "e2e"):
        assert row[f"{name}_p50_ms"] == 0 and row[f"{name}_p99_ms"] == 0, name
    assert row["throughput_tokens_per_s"] is None and row["throughput_requests_per_s"] is None
    assert row["goodput_requests_per_s"] is None
    assert row["slo_attainment_pct"] == approx(75.0)
    assert row["kv_util_mean_pct"] == approx(100 * 28 / 11 / 4)
    assert row["kv_held_mean_pct"] == approx(100 * 38 / 11 / 4)
    assert row["kv_util_peak_pct"] == approx(75.0)
    assert {r: reqs[r]["finish_ms"] for r in "ABC"} == {"A": 0, "B": 0, "C": 0}
    assert timeline == []  # no time to cut into buckets


def test_a_run_with_no_iteration_reports_zero_utilisation(cli, tmp_path) -> None:
    """A one-block pool of 4 tokens: A needs ceil((1 + 11) / 4) = 3 blocks, D ceil(17 / 4) = 5,
    so both are rejected on arrival and no iteration runs. Utilisation is 0 % (nothing was
    ever held), not 100 %; nothing is admitted or finished; rates are undefined."""
    reqs = [SCENARIO_1[0], SCENARIO_1[3]]
    admit = ADMIT_1.replace("capacity_blocks: 4", "capacity_blocks: 1")
    row, summary, lines, _ = _run(cli, tmp_path, reqs, admit)
    assert row["iterations"] == 0 and row["makespan_s"] == 0
    assert (row["finished"], row["rejected"], row["admission_rate_pct"]) == (0, 2, 0)
    assert (row["kv_util_mean_pct"], row["kv_util_peak_pct"], row["kv_held_mean_pct"]) == (0, 0, 0)
    assert row["slo_attainment_pct"] == 0 and row["goodput_requests_per_s"] is None
    assert row["ttft_p50_ms"] is None and row["e2e_p99_ms"] is None
    assert {r["reason"] for r in lines.values()} == {"exceeds_kv_capacity"}


def _req(i: int, max_new: int) -> Req:
    r = SimpleNamespace(rid=f"r{i}", prompt_tokens=10, max_new_tokens=max_new, hash_ids=(),
                        l1_cached_tokens=0, l2_cached_tokens=0, priority=None,
                        deadline_ms=None, cancel_ms=None)  # fmt: skip
    return Req.of(i, r, 0.0)


def test_headroom_clips_a_request_with_more_than_4096_tokens_left() -> None:
    """SGLang reserves ``min(max_new - generated, 4096)`` per running request. A has 5,000
    tokens to go (clipped to 4,096 until it has generated 904), B 3,000 (never clipped); after
    G decode steps each has generated G, so the headroom is
    ``min(5000 - G, 4096) + (3000 - G)``, checked at every step up to 1,000 (past the
    moment A's remainder drops below the clip)."""
    assert CLIP_MAX_NEW_TOKENS == 4096
    pool = KvPool(block_size=16, capacity_blocks=100_000, victim="scan_order")
    a, b = _req(0, 5000), _req(1, 3000)
    for r in (a, b):
        pool.take(r, 10, None)
        pool.join(r, 10)
    for steps in range(1001):
        assert pool.headroom_tokens() == min(5000 - steps, 4096) + (3000 - steps), steps
        tokens, _, finishing = pool.decode()
        assert tokens == 2 and finishing == []
