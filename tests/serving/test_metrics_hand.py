"""``cpkv admit`` with ``admit.mode=serving``: every metric of a tiny run against values
derived here by hand from the rules (not from cpkv's output).

The rules used (docstrings of :mod:`cpkv.serving.engine.engine`,
:mod:`cpkv.serving.model.kv_pool`, :mod:`cpkv.serving.schedulers.blocks`,
:mod:`cpkv.serving.record.metrics` and seed 004):

* an iteration decodes first (one token per running request), then admits and prefills;
  a request whose prompt is complete generates its first token in the same iteration;
  tokens are stamped at the end of the iteration; a request that generated ``max_new``
  tokens frees its blocks at the end of that iteration;
* every token (prompt or generated) takes its KV slot when it is produced, a request
  holding ``ceil(length / block)`` blocks; ``conservative`` also reserves
  ``ceil((prompt + max_new) / block)`` blocks at admission (``kv_held``);
* a request with ``ceil((prompt + max_new) / block) > capacity`` is rejected on arrival
  (``exceeds_kv_capacity``); under ``optimistic`` with ``victim: scan_order`` a growth that
  does not fit preempts the grower itself, and ``on_preempt: abort`` rejects it
  (``preempted``);
* the cost model here is ``fixed_us + prefill_token_us x prefill tokens`` (other
  coefficients 0);
* queue = admission - arrival, TTFT = first token - arrival, E2E = finish - arrival, TPOT
  = (finish - first token) / (tokens - 1); percentiles interpolate linearly between order
  statistics (rank = q/100 x (n - 1)); KV utilisation is time-weighted over the makespan,
  sampled after an iteration's allocations and before its finishes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

approx = pytest.approx


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _run(cli, tmp_path: Path, requests: list[dict], admit: str) -> tuple[dict, dict, dict, list]:
    """Serve ``requests`` (prefill-model JSONL lines) with the ``admit:`` body ``admit``;
    returns (row, summary, requests.jsonl by rid, timeline.jsonl)."""
    work = tmp_path / "work.jsonl"
    work.write_text("".join(json.dumps(r) + "\n" for r in requests))
    cfg = tmp_path / "serving.yaml"
    cfg.write_text(
        "kind: admit\nname: hand\nseed: 0\nadmit:\n  mode: serving\n"
        f"  workload: {{source: jsonl, path: {work}}}\n"
        "  iteration: {budget_tokens: 1000, chunk_tokens: 1000}\n"
        "  arrivals: {process: trace}\n" + admit
    )
    res = cli("admit", str(cfg))
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    doc = cli.results(run)
    (row,) = doc["rows"]
    reqs = {r["rid"]: r for r in _lines(run / "requests.jsonl")}
    return row, doc["summary"], reqs, _lines(run / "timeline.jsonl")


# -- scenario 1: conservative, a 4 x 4-token pool ----------------------------------------------
#
# A (prompt 1, max_new 11) reserves ceil(12/4) = 3 blocks, B (1, 3) ceil(4/4) = 1: the pool
# (4) is fully reserved, C (2, 2; reserve 1) waits; D (16, 1) needs ceil(17/4) = 5 > 4:
# rejected on arrival. Iteration k costs 1 ms + 0.5 ms per prompt token computed:
#
#   it   time     prefill   A len/blocks  B len/blocks  C len/blocks  used held run wait
#   0    [0, 2]   A1 + B1   2 / 1         2 / 1         (waits)       2    4    2   1
#   1    [2, 3]             3 / 1         3 / 1                       2    4    2   1
#   2    [3, 4]             4 / 1         4 / 1  done   (waits)       2    4    2   1
#   3    [4, 6]   C2        5 / 2                       3 / 1         3    4    2   0
#   4    [6, 7]             6 / 2                       4 / 1  done   3    4    2   0
#   5    [7, 8]             7 / 2                                     2    3    1   0
#   6    [8, 9]             8 / 2                                     2    3    1   0
#   7-10 [9, 13]            9..12 / 3  (done at 13)                   3    3    1   0
#
# (B's 3 tokens: iterations 0, 1, 2; its block frees at 4 ms, so C is admitted in it 3.)
# A: admitted 0, first token 2, finish 13, 11 tokens -> queue 0, TTFT 2, E2E 13, TPOT 11/10
# B: admitted 0, first 2, finish 4, 3 tokens         -> queue 0, TTFT 2, E2E 4,  TPOT 2/2
# C: admitted 4, first 6, finish 7, 2 tokens         -> queue 4, TTFT 6, E2E 7,  TPOT 1/1
SCENARIO_1 = [
    {"rid": "A", "extend_tokens": 1, "max_new_tokens": 11},
    {"rid": "B", "extend_tokens": 1, "max_new_tokens": 3},
    {"rid": "C", "extend_tokens": 2, "max_new_tokens": 2},
    {"rid": "D", "extend_tokens": 16, "max_new_tokens": 1},
]
ADMIT_1 = """\
  policy: conservative
  kv: {block_size: 4, capacity_blocks: 4, scan: first_fit, victim: scan_order}
  cost: {kind: linear, fixed_us: 1000, prefill_token_us: 500, decode_request_us: 0, context_token_us: 0,
         kv_bytes_per_token: 1, l2_load_gb_per_s: null}
  slo: {ttft_ms: 5, tpot_ms: 1.05}
  serving: {on_preempt: abort, timeline_points: 13}
"""


@pytest.fixture
def scenario_1(cli, tmp_path):
    return _run(cli, tmp_path, SCENARIO_1, ADMIT_1)


def test_counts_and_rejections_by_hand(scenario_1) -> None:
    row, summary, reqs, _ = scenario_1
    assert row["requests"] == 4 and row["finished"] == 3 and row["rejected"] == 1
    # A, B, C admitted, D never: 3 of 4
    assert row["admission_rate_pct"] == approx(75.0)
    assert row["preemptions"] == 0 and row["recomputed_tokens"] == 0
    assert row["iterations"] == 11 and row["makespan_s"] == approx(0.013)
    assert summary["rejected_by_reason"] == {"exceeds_kv_capacity": 1}
    assert summary["preemptions_by_reason"] == {}
    assert summary["decode_tokens"] == 10 + 2 + 1  # tokens after the first: A 10, B 2, C 1
    assert summary["prefill_tokens_computed"] == 1 + 1 + 2
    d = reqs["D"]
    assert d["status"] == "rejected" and d["reason"] == "exceeds_kv_capacity"
    assert d["admitted_ms"] is None and d["queue_ms"] is None and d["finish_ms"] == 0.0


def test_per_request_latencies_by_hand(scenario_1) -> None:
    _, _, reqs, _ = scenario_1
    want = {  # admitted, first token, finish, queue, ttft, tpot, e2e, tokens (ms)
        "A": (0.0, 2.0, 13.0, 0.0, 2.0, 1.1, 13.0, 11),
        "B": (0.0, 2.0, 4.0, 0.0, 2.0, 1.0, 4.0, 3),
        "C": (4.0, 6.0, 7.0, 4.0, 6.0, 1.0, 7.0, 2),
    }
    keys = (
        "admitted_ms", "first_token_ms", "finish_ms", "queue_ms", "ttft_ms", "tpot_ms", "e2e_ms",
        "output_tokens",
    )  # fmt: skip
    for rid, values in want.items():
        got = reqs[rid]
        assert got["status"] == "finished" and got["arrival_ms"] == 0.0
        assert tuple(got[k] for k in keys) == approx(values), rid


def test_latency_means_and_percentiles_by_hand(scenario_1) -> None:
    row = scenario_1[0]
    # sorted series; p(q) at rank q/100 x 2 between x0, x1, x2
    # queue [0, 0, 4]: p90 = 0 + 4 x 0.8, p95 = 4 x 0.9, p99 = 4 x 0.98
    # ttft  [2, 2, 6]: p90 = 2 + 4 x 0.8 ...
    # tpot  [1, 1, 1.1]: p90 = 1 + 0.1 x 0.8 ...
    # e2e   [4, 7, 13]: p50 = 7, p90 = 7 + 6 x 0.8 ...
    want = {
        "queue": (4 / 3, 0.0, 3.2, 3.6, 3.92),
        "ttft": (10 / 3, 2.0, 5.2, 5.6, 5.92),
        "tpot": (3.1 / 3, 1.0, 1.08, 1.09, 1.098),
        "e2e": (24 / 3, 7.0, 11.8, 12.4, 12.88),
    }
    for name, (mean, p50, p90, p95, p99) in want.items():
        got = [row[f"{name}_{k}_ms"] for k in ("mean", "p50", "p90", "p95", "p99")]
        assert got == approx([mean, p50, p90, p95, p99]), name


def test_throughput_goodput_and_slo_by_hand(scenario_1) -> None:
    row = scenario_1[0]
    # 11 + 3 + 2 tokens, 3 requests over 13 ms; SLO TTFT <= 5, TPOT <= 1.05:
    # A misses (TPOT 1.1), C misses (TTFT 6), B meets: 1 of 4 requests
    assert row["throughput_tokens_per_s"] == approx(16 / 0.013)
    assert row["throughput_requests_per_s"] == approx(3 / 0.013)
    assert row["goodput_requests_per_s"] == approx(1 / 0.013)
    assert row["slo_attainment_pct"] == approx(25.0)


def test_kv_utilisation_by_hand(scenario_1) -> None:
    row = scenario_1[0]
    # used x ms: 2x2 + 2 + 2 + 3x2 + 3 + 2 + 2 + 3x4 = 33 of 4 x 13 = 52
    # held x ms: 4x2 + 4 + 4 + 4x2 + 4 + 3x6       = 46 of 52
    assert row["kv_util_mean_pct"] == approx(100 * 33 / 52)
    assert row["kv_held_mean_pct"] == approx(100 * 46 / 52)
    # peaks over iterations: 3 blocks used (4 held, which the used peak must not read)
    assert row["kv_util_peak_pct"] == approx(75.0)


def test_timeline_buckets_by_hand(scenario_1) -> None:
    points = scenario_1[3]
    # 13 buckets of 1 ms: bucket k is [k, k+1] ms, inside a single iteration (see the table)
    used = [2, 2, 2, 2, 3, 3, 3, 2, 2, 3, 3, 3, 3]
    held = [4, 4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 3, 3]
    running = [2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1]
    waiting = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert [p["t_s"] for p in points] == approx([k / 1000 for k in range(13)])
    assert [p["kv_used_mean_pct"] for p in points] == approx([25.0 * u for u in used])
    assert [p["kv_used_peak_pct"] for p in points] == approx([25.0 * u for u in used])
    assert [p["kv_held_mean_pct"] for p in points] == approx([25.0 * h for h in held])
    assert [p["running_mean"] for p in points] == approx(running)
    assert [p["waiting_mean"] for p in points] == approx(waiting)


def test_timeline_bucket_spanning_iterations_by_hand(cli, tmp_path) -> None:
    # the same run in 2 buckets of 6.5 ms: bucket 0 = its 0-3 (used 2x2 + 2 + 2 + 3x2 = 14,
    # held 4x2 + 4 + 4 + 4x2 = 24) + half of it 4 (3 used, 4 held, 0.5 ms); bucket 1 = the
    # other half of it 4 + its 5-10 (used 1.5 + 2 + 2 + 3x4, held 2 + 3x6); peaks 3 and 3
    admit = ADMIT_1.replace("timeline_points: 13", "timeline_points: 2")
    points = _run(cli, tmp_path, SCENARIO_1, admit)[3]
    width = 6.5 * 4 / 100  # block-ms per percent
    assert [p["t_s"] for p in points] == approx([0.0, 0.0065])
    assert [p["kv_used_mean_pct"] for p in points] == approx([15.5 / width, 17.5 / width], abs=1e-4)
    assert [p["kv_held_mean_pct"] for p in points] == approx([26 / width, 20 / width], abs=1e-4)
    assert [p["kv_used_peak_pct"] for p in points] == approx([75.0, 75.0])


# -- scenario 2: optimistic, a 2 x 4-token pool, victims aborted ------------------------------
#
# A (prompt 4, max_new 2) and B (4, 1) are admitted on their prompt blocks (1 + 1 = 2, the
# pool) and prefilled in iteration 0 [0, 1 ms]; C (9, 1) needs ceil(10/4) = 3 > 2 blocks:
# rejected on arrival. A's first token needs a 2nd block, none is free: scan_order preempts
# A itself (its 4 KV tokens discarded), abort rejects it; B's first token takes A's freed
# block, B has its 1 token and finishes at 1 ms, holding 2 blocks (the whole pool).
SCENARIO_2 = [
    {"rid": "A", "extend_tokens": 4, "max_new_tokens": 2},
    {"rid": "B", "extend_tokens": 4, "max_new_tokens": 1},
    {"rid": "C", "extend_tokens": 9, "max_new_tokens": 1},
]
ADMIT_2 = """\
  policy: optimistic
  kv: {block_size: 4, capacity_blocks: 2, scan: first_fit, victim: scan_order}
  cost: {kind: linear, fixed_us: 1000, prefill_token_us: 0, decode_request_us: 0, context_token_us: 0,
         kv_bytes_per_token: 1, l2_load_gb_per_s: null}
  serving: {on_preempt: abort, timeline_points: 1}
"""


def test_preempted_before_first_token_counts_as_admitted(cli, tmp_path) -> None:
    row, summary, reqs, points = _run(cli, tmp_path, SCENARIO_2, ADMIT_2)
    assert row["requests"] == 3 and row["finished"] == 1 and row["rejected"] == 2
    # A and B were admitted (A never produced a token): 2 of 3
    assert row["admission_rate_pct"] == approx(200 / 3)
    assert row["preemptions"] == 1 and row["recomputed_tokens"] == 4
    assert summary["rejected_by_reason"] == {"exceeds_kv_capacity": 1, "preempted": 1}
    assert summary["preemptions_by_reason"] == {"kv_growth_first_token": 1}
    a, b, c = reqs["A"], reqs["B"], reqs["C"]
    assert (a["status"], a["reason"], a["admitted_ms"], a["first_token_ms"]) == (
        "rejected", "preempted", 0.0, None,
    )  # fmt: skip
    assert (a["preemptions"], a["recomputed_tokens"], a["finish_ms"]) == (1, 4, 1.0)
    assert (c["status"], c["reason"], c["admitted_ms"]) == ("rejected", "exceeds_kv_capacity", None)
    assert (b["queue_ms"], b["ttft_ms"], b["e2e_ms"], b["tpot_ms"]) == (0.0, 1.0, 1.0, None)
    # queue counts every admitted request (A, B: 0, 0); TTFT/E2E the finished B; no TPOT
    assert (row["queue_mean_ms"], row["queue_p99_ms"]) == (0.0, 0.0)
    assert (row["ttft_mean_ms"], row["e2e_mean_ms"], row["e2e_p50_ms"]) == approx((1, 1, 1))
    assert row["tpot_mean_ms"] is None and row["tpot_p99_ms"] is None
    assert row["makespan_s"] == approx(0.001) and row["iterations"] == 1
    assert row["throughput_tokens_per_s"] == approx(1000.0)
    # one iteration: B's 2 blocks of 2 used and held
    assert row["kv_util_mean_pct"] == approx(100.0) and row["kv_util_peak_pct"] == approx(100.0)
    assert row["kv_held_mean_pct"] == approx(100.0)
    (point,) = points
    assert point["kv_used_mean_pct"] == approx(100.0) and point["running_mean"] == approx(1.0)


# -- scenario 3: scenario 2 without C, victims re-queued (recompute) --------------------------
#
# Iteration 0 [0, 1] as in scenario 2, but A waits again (its prompt still 4 tokens: it had
# generated none). B frees its 2 blocks at 1 ms: iteration 1 [1, 2] admits A again
# (1 block), recomputes its 4 prompt tokens and gives its first token (a 2nd block);
# iteration 2 [2, 3] its 2nd token (length 6, 2 blocks): A finishes at 3 ms.
# A: first admission 0 -> queue 0, TTFT 2, E2E 3, TPOT 1/1; B: queue 0, TTFT 1, E2E 1.
def test_requeued_victim_keeps_its_first_admission(cli, tmp_path) -> None:
    admit = ADMIT_2.replace("on_preempt: abort", "on_preempt: requeue")
    row, summary, reqs, _ = _run(cli, tmp_path, SCENARIO_2[:2], admit)
    assert row["finished"] == 2 and row["rejected"] == 0
    assert row["admission_rate_pct"] == approx(100.0)
    assert row["preemptions"] == 1 and row["recomputed_tokens"] == 4
    assert summary["rejected_by_reason"] == {}
    assert summary["preemptions_by_reason"] == {"kv_growth_first_token": 1}
    assert summary["prefill_tokens_computed"] == 4 + 4 + 4
    a = reqs["A"]
    assert (a["admitted_ms"], a["first_token_ms"], a["finish_ms"]) == approx((0.0, 2.0, 3.0))
    assert (a["queue_ms"], a["ttft_ms"], a["tpot_ms"], a["e2e_ms"]) == approx((0, 2, 1, 3))
    assert (a["computed_prompt_tokens"], a["output_tokens"]) == (8, 2)
    assert row["makespan_s"] == approx(0.003) and row["iterations"] == 3
    # TTFT [1, 2], E2E [1, 3]: p50 = 1.5 and 2, p90 = 1.9 and 2.8
    assert (row["ttft_p50_ms"], row["ttft_p90_ms"]) == approx((1.5, 1.9))
    assert (row["e2e_p50_ms"], row["e2e_p90_ms"], row["e2e_p99_ms"]) == approx((2.0, 2.8, 2.98))
    assert (row["queue_mean_ms"], row["tpot_p95_ms"]) == approx((0.0, 1.0))
    # 2 of 2 blocks used in each of the 3 iterations
    assert row["kv_util_mean_pct"] == approx(100.0) and row["kv_held_mean_pct"] == approx(100.0)


# -- scenario 4: a request with max_new_tokens 0 ----------------------------------------------
#
# conservative, 8 x 4-token blocks, 1 ms per iteration. Z (prompt 4, max_new 0) reserves
# and uses ceil(4/4) = 1 block, B (4, 2) reserves ceil(6/4) = 2. Iteration 0 [0, 1]
# prefills both: Z is done without a token (it finishes at 1 ms, its block freed at the end
# of the iteration like any finishing request's), B's first token is its 5th KV token (2
# blocks): 1 + 2 = 3 blocks used and held. Iteration 1 [1, 2]: B's 2nd token (length 6,
# 2 blocks); B finishes at 2 ms.
def test_zero_token_request_holds_its_blocks_through_its_iteration(cli, tmp_path) -> None:
    work = [
        {"rid": "Z", "extend_tokens": 4, "max_new_tokens": 0},
        {"rid": "B", "extend_tokens": 4, "max_new_tokens": 2},
    ]
    admit = """\
  policy: conservative
  kv: {block_size: 4, capacity_blocks: 8, scan: first_fit, victim: scan_order}
  cost: {kind: linear, fixed_us: 1000, prefill_token_us: 0, decode_request_us: 0, context_token_us: 0,
         kv_bytes_per_token: 1, l2_load_gb_per_s: null}
  serving: {timeline_points: 2}
"""
    row, _, reqs, points = _run(cli, tmp_path, work, admit)
    assert row["finished"] == 2 and row["admission_rate_pct"] == approx(100.0)
    z = reqs["Z"]
    assert (z["status"], z["output_tokens"], z["first_token_ms"], z["finish_ms"]) == (
        "finished", 0, None, 1.0,
    )  # fmt: skip
    assert (z["queue_ms"], z["ttft_ms"], z["tpot_ms"], z["e2e_ms"]) == (0.0, None, None, 1.0)
    # TTFT: B alone (1 ms); E2E [1, 2]; 2 tokens over 2 ms
    assert (row["ttft_mean_ms"], row["ttft_p50_ms"]) == approx((1.0, 1.0))
    assert (row["e2e_mean_ms"], row["e2e_p90_ms"]) == approx((1.5, 1.9))
    assert row["throughput_tokens_per_s"] == approx(1000.0)
    # (3 + 2) block-ms of 8 x 2; peak 3 of 8
    assert row["kv_util_mean_pct"] == approx(100 * 5 / 16)
    assert row["kv_held_mean_pct"] == approx(100 * 5 / 16)
    assert row["kv_util_peak_pct"] == approx(100 * 3 / 8)
    assert [p["kv_used_mean_pct"] for p in points] == approx([100 * 3 / 8, 100 * 2 / 8])
