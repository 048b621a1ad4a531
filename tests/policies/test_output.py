"""Seed-004 policies shaped as run output: rows, summary, growth.jsonl, results.json roles."""

from __future__ import annotations

import json

from cpkv.policies.blocks import BlockRequest, KvBlocks
from cpkv.policies.iteration import IterationBudget
from cpkv.policies.output import block_policy_output
from cpkv.policies.registry import BlockPolicyInputs
from cpkv.policies.requests import block_requests_from
from cpkv.runs.results import RunRecord
from cpkv.workload.request import Request

SEED = BlockPolicyInputs(requests=(BlockRequest("A", 6, 6), BlockRequest("B", 4, 4)))


def test_iteration_output_rows_and_summary() -> None:
    out = block_policy_output("iteration", SEED)
    assert [(r.tick, r.remaining_prompt_tokens) for r in out.rows] == [(0, 8), (1, 4), (2, 0)]
    # 3 ticks x 6 tokens, all spent: 3 x 2 decode + 12 prompt
    assert (out.summary["ticks"], out.summary["decode_tokens"], out.summary["prefill_tokens"]) == (
        3,
        6,
        12,
    )
    assert out.summary["budget_utilization"] == 1.0
    short = block_policy_output(
        "iteration", BlockPolicyInputs(iteration=IterationBudget(6, 2, 10, 4))
    )
    assert short.summary["budget_utilization"] == 16 / 18  # last tick carries 2 prompt tokens


def test_optimistic_output_carries_the_growth_trace() -> None:
    out = block_policy_output("optimistic", SEED)
    lines = [json.loads(line) for line in out.extras["growth.jsonl"].splitlines()]
    assert lines[4] == {"step": 2, "rid": "A", "event": "preempted", "used_blocks": 2}
    assert len(lines) == 7
    s = out.summary
    assert (s["admitted"], s["waiting"], s["preemptions"], s["preempted_rids"]) == (2, 0, 1, ["A"])
    assert (s["reserved_blocks"], s["peak_used_blocks"], s["final_used_blocks"]) == (3, 4, 2)
    assert (s["scan"], s["victim"], s["generated_tokens"]) == ("all_or_error", "scan_order", 6)


def test_conservative_output_and_result_roles() -> None:
    out = block_policy_output(
        "conservative", BlockPolicyInputs(kv=KvBlocks(scan="fcfs_stop"), requests=SEED.requests)
    )
    assert out.extras == {}
    assert (out.summary["admitted_rids"], out.summary["scan"], out.summary["waiting"]) == (
        ["A"],
        "fcfs_stop",
        1,
    )
    record = RunRecord.from_output("admit", "t", out)
    assert record.columns.identity == ("rid", "prompt_tokens", "max_new_tokens")
    assert record.columns.outcomes == ("admitted", "reason")
    assert record.rows[1] == {
        "rid": "B",
        "prompt_tokens": 4,
        "max_new_tokens": 4,
        "need_blocks": 2,
        "admitted": False,
        "reason": "no_room",
        "reserved_blocks_after": 3,
    }
    assert RunRecord.from_json(record.to_json()).rows == record.rows


def test_prefill_requests_become_block_requests_with_their_fill_length() -> None:
    reqs = [Request("a", 2, 3, 4), Request("b", 0, 0, 5, max_new_tokens=1)]
    assert block_requests_from(reqs, 7) == (BlockRequest("a", 9, 7), BlockRequest("b", 5, 1))
