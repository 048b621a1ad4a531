"""cpkv's own admission policies in the serving engine, on small cases derived by hand
(``cpkv.serving.engine.lifecycle``, ``cpkv.serving.schedulers``): queue timeout,
cancellation (waiting, prefilling, running), the profiled reservation, swap against
recompute, SGLang's priority preemption, the deadline order with its aging bound. Every iteration costs 1 ms (``fixed_us: 1000``, all
other coefficients 0) unless a case says otherwise; tokens are stamped at the end of the
iteration that generates them; the engine notices cancellations and timeouts at iteration
boundaries, before that iteration's admissions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

approx = pytest.approx
COST = (
    "  cost: {kind: linear, fixed_us: 1000, prefill_token_us: 0, decode_request_us: 0, "
    "context_token_us: 0, kv_bytes_per_token: 1000, l2_load_gb_per_s: LOAD}\n"
)


def _run(cli, tmp_path: Path, requests: list[dict], admit: str, load: str = "null", *args: str):
    work = tmp_path / "work.jsonl"
    work.write_text("".join(json.dumps(r) + "\n" for r in requests))
    cfg = tmp_path / "serving.yaml"
    cfg.write_text(
        "kind: admit\nname: hand\nseed: 0\nadmit:\n  mode: serving\n"
        f"  workload: {{source: jsonl, path: {work}}}\n"
        "  iteration: {budget_tokens: 1000, chunk_tokens: 1000}\n"
        "  arrivals: {process: trace}\n" + COST.replace("LOAD", load) + admit
    )
    res = cli("admit", str(cfg), "admit.serving.check_invariants=true", *args)
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    doc = cli.results(run)
    (row,) = doc["rows"]
    lines = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    return row, doc["summary"], {r["rid"]: r for r in lines}


CONSERVATIVE_4x4 = """\
  policy: conservative
  kv: {block_size: 4, capacity_blocks: 4, scan: first_fit, victim: scan_order}
"""


def test_queue_timeout_by_hand(cli, tmp_path) -> None:
    # A (prompt 1, max_new 11) reserves ceil(12/4) = 3 blocks, B (1, 3) 1: the pool is full
    # and C (2, 2) waits from t = 0. B's third token ends iteration 2 at t = 3 ms; at that
    # boundary C has waited 3 >= 2.5 ms: it times out before the iteration that could admit it.
    reqs = [
        {"rid": "A", "extend_tokens": 1, "max_new_tokens": 11},
        {"rid": "B", "extend_tokens": 1, "max_new_tokens": 3},
        {"rid": "C", "extend_tokens": 2, "max_new_tokens": 2},
    ]
    row, summary, out = _run(
        cli, tmp_path, reqs, CONSERVATIVE_4x4 + "  serving: {queue_timeout_ms: 2.5}\n"
    )
    c = out["C"]
    assert (c["status"], c["reason"], c["finish_ms"], c["admitted_ms"]) == (
        "timed_out", "waiting", 3.0, None,
    )  # fmt: skip
    assert row["timed_out"] == 1 and row["finished"] == 2 and row["rejected"] == 0
    assert row["longest_wait_ms"] == approx(3.0)  # C's 3 ms; A and B waited 0
    assert summary["policy_space"]["terminal"] == {
        "finished": 2, "rejected": 0, "timed_out": 1, "cancelled": 0,
    }  # fmt: skip
    assert out["A"]["finish_ms"] == 11.0  # 11 tokens, one per iteration, from t = 0


def test_cancellation_waiting_and_running_by_hand(cli, tmp_path) -> None:
    # As above, plus D (1, 1), which waits behind C, cancelled at 2 ms; A cancelled at 4.5 ms.
    # t=3: B finished, its block is free: C (ceil(4/4) = 1 block) is admitted in iteration 3
    # [3, 4] (first token at 4), its second token at 5 (done). A generated one token per
    # iteration 0..4 (5 tokens) when the boundary at 5 ms notices its cancel time (4.5 ms).
    reqs = [
        {"rid": "A", "extend_tokens": 1, "max_new_tokens": 11, "cancel_ms": 4.5},
        {"rid": "B", "extend_tokens": 1, "max_new_tokens": 3},
        {"rid": "C", "extend_tokens": 2, "max_new_tokens": 2},
        {"rid": "D", "extend_tokens": 1, "max_new_tokens": 1, "cancel_ms": 2.0},
    ]
    row, summary, out = _run(cli, tmp_path, reqs, CONSERVATIVE_4x4)
    a, d = out["A"], out["D"]
    assert (a["status"], a["reason"], a["finish_ms"], a["output_tokens"]) == (
        "cancelled", "running", 5.0, 5,
    )  # fmt: skip
    assert a["first_token_ms"] == 1.0 and a["e2e_ms"] is None
    assert (d["status"], d["reason"], d["finish_ms"], d["admitted_ms"]) == (
        "cancelled", "waiting", 2.0, None,
    )  # fmt: skip
    c = out["C"]
    assert (c["status"], c["admitted_ms"], c["first_token_ms"], c["finish_ms"]) == (
        "finished", 3.0, 4.0, 5.0,
    )  # fmt: skip
    assert row["cancelled"] == 2 and row["finished"] == 2
    assert summary["policy_space"]["cancelled_by_where"] == {"running": 1, "waiting": 1}
    assert row["makespan_s"] == approx(0.005)  # nothing runs after A's cancellation


def test_cancellation_while_prefilling_by_hand(cli, tmp_path) -> None:
    # optimistic, chunks of 2 tokens: P (prompt 8) computes 2 tokens in each of iterations 0
    # and 1; the boundary at 2 ms notices its cancel time (1.5 ms): it frees its 2 blocks.
    reqs = [{"rid": "P", "extend_tokens": 8, "max_new_tokens": 2, "cancel_ms": 1.5}]
    admit = "  policy: optimistic\n  kv: {block_size: 4, capacity_blocks: 4}\n"
    row, _, out = _run(cli, tmp_path, reqs, admit, "null", "admit.iteration.chunk_tokens=2")
    p = out["P"]
    assert (p["status"], p["reason"], p["finish_ms"], p["computed_prompt_tokens"]) == (
        "cancelled", "prefilling", 2.0, 4,
    )  # fmt: skip
    assert row["cancelled"] == 1 and row["iterations"] == 2


def test_profiled_reservation_by_hand(cli, tmp_path) -> None:
    # A, B, C: prompt 4, max_new 4, all at t = 0; pool 4 blocks of 4; quantile 0.5, cold start
    # 1 token. Cold: each reserves ceil((4 + 1) / 4) = 2 blocks. A: 2 <= 4 free, admitted
    # (outstanding 2 - 1 held = 1); B: 2 + 1 <= 3 free, admitted (outstanding 2); C: 2 + 2 > 2
    # free: waits. A and B generate 4 tokens each (iterations 0-3, done at 4 ms), 3 more
    # than they reserved: 2 reservations exceeded. Then the quantile of [4, 4] is 4: C reserves
    # ceil((4 + 4) / 4) = 2 <= 4 free, admitted at 4 ms, first token 5, done at 8.
    reqs = [{"rid": r, "extend_tokens": 4, "max_new_tokens": 4} for r in "ABC"]
    admit = (
        "  policy: profiled\n  kv: {block_size: 4, capacity_blocks: 4}\n"
        "  profiled: {quantile: 0.5, window: 10, cold_start_tokens: 1}\n"
    )
    row, summary, out = _run(cli, tmp_path, reqs, admit)
    assert [out[r]["admitted_ms"] for r in "ABC"] == [0.0, 0.0, 4.0]
    assert (out["C"]["first_token_ms"], out["C"]["finish_ms"]) == (5.0, 8.0)
    prof = summary["policy_space"]["profiled"]
    assert (prof["reservation_exceeded"], prof["finished"], prof["final_quantile_tokens"]) == (
        2,
        3,
        4,
    )
    assert row["reservation_exceeded"] == 2 and row["preemptions"] == 0
    assert summary["admission_stops"] == {"kv_blocks": 4}  # C examined at t = 0, 1, 2, 3


SWAP_CASE = [
    {"rid": "A", "extend_tokens": 3, "max_new_tokens": 6},
    {"rid": "B", "extend_tokens": 3, "max_new_tokens": 2},
]
SWAP_ADMIT = """\
  policy: optimistic
  load_back_threshold: 1
  kv: {block_size: 4, capacity_blocks: 3, victim: largest_first}
  serving: {on_preempt: ON}
"""


@pytest.mark.parametrize("mode", ["swap", "requeue"])
def test_swap_against_recompute_by_hand(cli, tmp_path, mode) -> None:
    # Pool 3 blocks of 4. It 0: A and B (prompt 3) take a block each, their first tokens fit
    # (length 4). It 1: A grows to 5 and takes the last block; B's growth finds none:
    # largest_first preempts A (2 blocks, 5 tokens: prompt 3 + 2 generated). B generates its
    # 2nd token and finishes. Swap: A's 5 tokens go to host at 1 us a token (1000 bytes at
    # 1 GB/s): it 1 lasts 1005 us; it 2 loads them back (1005 us) and A's 3rd token follows;
    # its last 3 tokens take it 3-5: done at 1 + 1.005 + 1.005 + 3 = 6.01 ms, nothing
    # recomputed. Recompute: no traffic (1 ms each), A computes its 5 tokens again, done at 6.
    row, summary, out = _run(cli, tmp_path, SWAP_CASE, SWAP_ADMIT.replace("ON", mode), load="1.0")
    a, b = out["A"], out["B"]
    space = summary["policy_space"]
    assert a["preemptions"] == 1 and a["output_tokens"] == 6 and a["first_token_ms"] == 1.0
    assert summary["preemptions_by_reason"] == {"kv_growth_decode": 1}
    if mode == "swap":
        assert (b["finish_ms"], a["finish_ms"]) == (2.005, 6.01)
        assert (space["swap_out_tokens"], space["swap_in_tokens"]) == (5, 5)
        assert row["swap_bytes"] == 10 * 1000 and row["recompute_bytes"] == 0
        assert a["recomputed_tokens"] == 0 and a["computed_prompt_tokens"] == 3
    else:
        assert (b["finish_ms"], a["finish_ms"]) == (2.0, 6.0)
        assert row["swap_bytes"] == 0 and row["recompute_bytes"] == 5 * 1000
        assert a["recomputed_tokens"] == 5 and a["computed_prompt_tokens"] == 3 + 5


def test_priority_preemption_by_hand(cli, tmp_path) -> None:
    # SGLang's priority scheduling, one request slot, larger values first, threshold 10.
    # A (priority 0) runs from t = 0 (first token at 1). B (priority 100) arrives at 1.5; at
    # the boundary t = 2 the batch is full and 100 - 0 > 10: B preempts A (after A's decode
    # step: 3 tokens, 4 + 3 = 7 KV tokens discarded). B: first token 3, done 4 (2 tokens). A
    # (0 - 100 is not > 10: no preemption of B) is admitted again at 4: prompt 4 + 3 outputs
    # recomputed, 4th token at 5, 5th at 6.
    reqs = [
        {"rid": "A", "extend_tokens": 4, "max_new_tokens": 5, "priority": 0},
        {"rid": "B", "extend_tokens": 4, "max_new_tokens": 2, "priority": 100, "arrival_ms": 1.5},
    ]
    admit = (
        "  kv: {block_size: 4, capacity_blocks: 64}\n  max_running_requests: 1\n"
        "  enable_priority_scheduling: true\n"
    )
    row, summary, out = _run(cli, tmp_path, reqs, admit)
    a, b = out["A"], out["B"]
    assert (b["admitted_ms"], b["first_token_ms"], b["finish_ms"]) == (2.0, 3.0, 4.0)
    assert (a["first_token_ms"], a["finish_ms"], a["preemptions"]) == (1.0, 6.0, 1)
    assert (a["recomputed_tokens"], a["computed_prompt_tokens"]) == (7, 4 + 7)
    assert summary["preemptions_by_reason"] == {"priority": 1}
    assert row["preemptions_priority"] == 1 and row["preemptions_growth"] == 0


@pytest.mark.parametrize(("aging_ms", "order"), [(1000, ["Y", "X", "Z"]), (1.5, ["Y", "Z", "X"])])
def test_deadline_order_and_aging_by_hand(cli, tmp_path, aging_ms, order) -> None:
    # One request slot, each request 2 tokens (2 iterations). Y (deadline 10 ms) and Z (none)
    # arrive at 0, X (deadline 50 ms after its arrival at 0.5) later. t=0: Y first (EDF).
    # t=2 (Y done): X (deadline 50.5) before Z (none), unless both aged: with aging 1.5 ms Z
    # (waited 2) and X (waited 1.5) are both aged and go by arrival: Z first.
    reqs = [
        {"rid": "X", "extend_tokens": 4, "max_new_tokens": 2, "arrival_ms": 0.5, "deadline_ms": 50},
        {"rid": "Y", "extend_tokens": 4, "max_new_tokens": 2, "deadline_ms": 10},
        {"rid": "Z", "extend_tokens": 4, "max_new_tokens": 2},
    ]
    admit = (
        "  kv: {block_size: 4, capacity_blocks: 64}\n  max_running_requests: 1\n"
        f"  schedule_policy: deadline\n  deadline: {{aging_ms: {aging_ms}}}\n"
    )
    row, summary, out = _run(cli, tmp_path, reqs, admit)
    assert sorted(out, key=lambda rid: out[rid]["admitted_ms"]) == order
    assert [out[rid]["admitted_ms"] for rid in order] == [0.0, 2.0, 4.0]
    last = out[order[-1]]
    assert row["longest_wait_ms"] == approx(4.0 - last["arrival_ms"])


def test_policy_columns_only_when_asked(cli, tmp_path) -> None:
    # defaults: the row as before (no policy columns, no policy_space block); with
    # policy_metrics the columns are there and, nothing else changing, the shared ones equal
    reqs = [{"rid": "A", "extend_tokens": 4, "max_new_tokens": 3}]
    admit = "  kv: {block_size: 4, capacity_blocks: 8}\n"
    plain_dir, asked_dir = tmp_path / "plain", tmp_path / "asked"
    plain_dir.mkdir()
    asked_dir.mkdir()
    work = tmp_path / "work.jsonl"
    work.write_text(json.dumps(reqs[0]) + "\n")
    docs = []
    for extra in ([], ["admit.serving.policy_metrics=true"]):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "kind: admit\nname: hand\nseed: 0\nadmit:\n  mode: serving\n  engine: cpkv\n"
            f"  workload: {{source: jsonl, path: {work}}}\n" + COST.replace("LOAD", "null") + admit
        )
        res = cli("admit", str(cfg), *extra)
        assert res.exit_code == 0, res.output
        docs.append(cli.results(cli.run_dirs()[-1]))
    (plain,), (asked,) = docs[0]["rows"], docs[1]["rows"]
    assert "timed_out" not in plain and "policy_space" not in docs[0]["summary"]
    assert asked["timed_out"] == 0 and asked["swap_bytes"] == 0
    assert asked["longest_wait_ms"] == 0.0  # admitted in the first iteration
    assert {k: asked[k] for k in plain} == plain


def test_trace_fields_cancel_and_bad_value(cli, tmp_path) -> None:
    # a Mooncake trace line may carry cancel_ms: A runs from t = 0 (first token at 1, then one
    # token a ms); its cancel time 2.5 ms is noticed at the boundary at 3 ms: 3 tokens.
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 5, "hash_ids": [1], "cancel_ms": 2.5}\n'
        '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [2], "priority": 3}\n'
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "kind: admit\nname: hand\nseed: 0\nadmit:\n  mode: serving\n"
        f"  workload: {{source: trace, path: {trace}, format: mooncake, block_size: 4}}\n"
        "  kv: {block_size: 4, capacity_blocks: 64}\n" + COST.replace("LOAD", "null")
    )
    res = cli("admit", str(cfg))
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    out = {
        json.loads(x)["rid"]: json.loads(x)
        for x in (run / "requests.jsonl").read_text().splitlines()
    }
    assert (out["r0"]["status"], out["r0"]["reason"], out["r0"]["output_tokens"], out["r0"]["finish_ms"]) == (
        "cancelled", "running", 3, 3.0,
    )  # fmt: skip
    assert out["r1"]["status"] == "finished"
    trace.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 5, "hash_ids": [1], "cancel_ms": -1}\n'
    )
    res = cli("admit", str(cfg))
    assert (
        res.exit_code == 2 and f"{trace}:1: field 'cancel_ms' must be a finite number" in res.stderr
    )


def test_sglang_order_applied_in_the_loop_by_hand(cli, tmp_path) -> None:
    # lof (longest max_new_tokens first), one request slot, all at t = 0, 1 ms iterations:
    # B (5 tokens) runs [0, 5], C (3) [5, 8], A (2) [8, 10]; fcfs would run A, B, C.
    reqs = [
        {"rid": "A", "extend_tokens": 4, "max_new_tokens": 2},
        {"rid": "B", "extend_tokens": 4, "max_new_tokens": 5},
        {"rid": "C", "extend_tokens": 4, "max_new_tokens": 3},
    ]
    admit = (
        "  kv: {block_size: 4, capacity_blocks: 64}\n  max_running_requests: 1\n"
        "  schedule_policy: lof\n"
    )
    _, summary, out = _run(cli, tmp_path, reqs, admit)
    assert [out[r]["admitted_ms"] for r in "BCA"] == [0.0, 5.0, 8.0]
    assert [out[r]["finish_ms"] for r in "BCA"] == [5.0, 8.0, 10.0]
    assert summary["policy_space"]["schedule_policy"] == "lof"
