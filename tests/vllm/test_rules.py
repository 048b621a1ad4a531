"""The rules of vLLM 0.32.0's V1 scheduler (the oracle README's list), on hand-built cases.

Every expected value is worked out from the rule by hand (block counts, chunk sizes, victims),
not read off the model.
"""

from __future__ import annotations

import pytest

from cpkv.vllm import Scheduler, SchedulerConfig, run_scenario
from cpkv.vllm.block_pool import BlockPool
from cpkv.vllm.queue import FcfsQueue, PriorityQueue
from cpkv.vllm.request import Request


def _run(config: dict, requests: list[dict], **kw) -> dict:
    return run_scenario({"config": config, "requests": requests, **kw})


def _step(result: dict, k: int) -> dict:
    return result["steps"][k]


def _scheduled(step: dict) -> dict[str, tuple[int, int]]:
    return {
        e["id"]: (e["n"], e["computed"]) for e in step["new"] + step["resumed"] + step["running"]
    }


# --- prefix cache -------------------------------------------------------------------------


def test_prefix_hit_is_whole_blocks_capped_at_num_tokens_minus_one():
    # A: 64 shared + 20 own = 84 tokens. B shares the 64 (4 blocks of 16): hit 64.
    # C is A again: cap 83 -> 5 whole blocks = 80. D shares nothing: 0.
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 128, "max_num_batched_tokens": 512},
        [
            {"id": "A", "arrival": 0, "max_tokens": 4, "segments": [["sys", 64], ["a", 20]]},
            {"id": "B", "arrival": 2, "max_tokens": 4, "segments": [["sys", 64], ["b", 20]]},
            {"id": "C", "arrival": 3, "max_tokens": 4, "segments": [["sys", 64], ["a", 20]]},
            {"id": "D", "arrival": 3, "max_tokens": 4, "segments": [["x", 64], ["d", 20]]},
        ],
    )
    hits = {rid: s["prefix_hit_tokens"] for rid, s in res["requests"].items()}
    assert hits == {"A": 0, "B": 64, "C": 80, "D": 0}
    assert _scheduled(_step(res, 2))["B"] == (20, 64)


def test_block_aligned_identical_prompt_recomputes_its_whole_last_block():
    # 64 tokens = 4 full blocks; the cap 63 leaves 3 whole blocks: hit 48, 16 recomputed.
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 64},
        [
            {"id": "A", "arrival": 0, "max_tokens": 2, "segments": [["s", 64]]},
            {"id": "B", "arrival": 3, "max_tokens": 2, "segments": [["s", 64]]},
        ],
    )
    assert _scheduled(_step(res, 3))["B"] == (16, 48)


def test_blocks_are_cached_when_allocated_so_a_later_request_in_the_same_step_hits():
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 128, "max_num_batched_tokens": 512},
        [
            {"id": "A", "arrival": 0, "max_tokens": 2, "segments": [["sys", 64], ["a", 20]]},
            {"id": "B", "arrival": 0, "max_tokens": 2, "segments": [["sys", 64], ["b", 20]]},
        ],
    )
    assert _scheduled(_step(res, 0)) == {"A": (84, 0), "B": (20, 64)}
    # 6 blocks for A, 2 more for B (84 -> 6 blocks, 4 shared): 127 usable - 8.
    assert _step(res, 0)["free_blocks_after_schedule"] == 127 - 8


def test_prefix_caching_off_never_hits():
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 128, "enable_prefix_caching": False},
        [
            {"id": "A", "arrival": 0, "max_tokens": 2, "segments": [["sys", 64]]},
            {"id": "B", "arrival": 0, "max_tokens": 2, "segments": [["sys", 64]]},
        ],
    )
    assert _scheduled(_step(res, 0)) == {"A": (64, 0), "B": (64, 0)}


def test_freed_blocks_keyed_to_the_tail_unkeyed_to_the_head_tail_first():
    pool = BlockPool(8, enable_caching=True)  # blocks 1..7 usable
    a = pool.take(3)  # 1, 2, 3
    assert a == [1, 2, 3]
    pool.cache(a[0], key=100)
    pool.cache(a[1], key=101)  # block 3 stays unkeyed (a partial block)
    pool.release(list(reversed(a)))  # tail first: 3, 2, 1
    # 3 (no key) to the head; 2 then 1 (keyed) to the tail, in that order.
    assert pool.free_block_ids() == [3, 4, 5, 6, 7, 2, 1]
    # Allocation pops the head, and drops a key only when the block is reused.
    assert pool.cached_block(101) == a[1]
    pool.take(6)  # 3, 4, 5, 6, 7, 2
    assert pool.cached_block(101) is None and pool.cached_block(100) == a[0]


def test_a_hit_on_a_free_cached_block_takes_it_out_of_the_free_count():
    # A (32 tokens, 2 blocks) finishes; its 2 keyed blocks are free but cached. B = A's prompt
    # + 16 more hits both; they leave the free queue though no new block is needed for them.
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 10},
        [
            {"id": "A", "arrival": 0, "max_tokens": 1, "segments": [["s", 32]]},
            {"id": "B", "arrival": 3, "max_tokens": 1, "segments": [["s", 32], ["b", 16]]},
        ],
    )
    step = _step(res, 3)
    assert _scheduled(step)["B"] == (16, 32)
    # 9 usable; B holds 2 hit blocks + 1 new: 6 free.
    assert step["free_blocks_after_schedule"] == 6


def test_many_blocks_can_share_one_key_and_a_hit_takes_the_first_cached():
    pool = BlockPool(6, enable_caching=True)
    x, y = pool.take(2)
    pool.cache(x, key=7)
    pool.cache(y, key=7)
    assert pool.cached_block(7) == x
    pool.release([x])
    pool.take(4)  # 3, 4, 5, then x (block 1) is reused: its key goes, y's stays
    assert pool.cached_block(7) == y


# --- running requests, budgets -------------------------------------------------------------


def test_long_prefill_cap_applies_only_with_more_than_one_request():
    res = _run(
        {
            "block_size": 16,
            "num_gpu_blocks": 256,
            "max_num_batched_tokens": 256,
            "long_prefill_token_threshold": 128,
            "enable_prefix_caching": False,
        },
        [
            {"id": "long", "arrival": 0, "max_tokens": 3, "prompt_len": 1000},
            {"id": "short", "arrival": 2, "max_tokens": 3, "prompt_len": 30},
        ],
    )
    assert _scheduled(_step(res, 0)) == {"long": (256, 0)}
    assert _scheduled(_step(res, 1)) == {"long": (256, 256)}
    # From step 2 two requests exist: long is capped at 128, short gets 30 beside it.
    assert _scheduled(_step(res, 2)) == {"long": (128, 512), "short": (30, 0)}


def test_adaptive_cap_is_floored_at_a_fair_share_of_the_budget():
    # cap 16, budget 256, 2 requests: max(16, 256 // 2) = 128 each.
    res = _run(
        {
            "block_size": 16,
            "num_gpu_blocks": 256,
            "max_num_batched_tokens": 256,
            "long_prefill_token_threshold": 16,
            "long_prefill_token_threshold_adaptive": True,
        },
        [
            {"id": "a", "arrival": 0, "max_tokens": 2, "prompt_len": 500},
            {"id": "b", "arrival": 0, "max_tokens": 2, "prompt_len": 500},
        ],
    )
    assert _scheduled(_step(res, 0)) == {"a": (128, 0), "b": (128, 0)}


def test_the_budget_is_split_across_prefill_chunks_and_running_go_first():
    # Budget 16: a takes 12, b gets the last 4 as a chunk; next step a's decode comes first.
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 128, "max_num_batched_tokens": 16},
        [
            {"id": "a", "arrival": 0, "max_tokens": 5, "prompt_len": 12},
            {"id": "b", "arrival": 0, "max_tokens": 5, "prompt_len": 12},
            {"id": "c", "arrival": 0, "max_tokens": 5, "prompt_len": 12},
        ],
    )
    s0, s1 = _step(res, 0), _step(res, 1)
    assert _scheduled(s0) == {"a": (12, 0), "b": (4, 0)}
    assert s0["waiting_stop"] == "token_budget" and s0["token_budget_left"] == 0
    assert [e["id"] for e in s1["running"]] == ["a", "b"]
    assert _scheduled(s1) == {"a": (1, 12), "b": (8, 4), "c": (7, 0)}


def test_max_num_seqs_stops_admission():
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 128, "max_num_seqs": 2},
        [{"id": i, "arrival": 0, "max_tokens": 5, "prompt_len": 10} for i in "abc"],
    )
    s0 = _step(res, 0)
    assert [e["id"] for e in s0["new"]] == ["a", "b"]
    assert s0["waiting_stop"] == "max_num_seqs" and s0["queue_waiting"] == ["c"]


def test_max_model_len_stops_a_request_before_max_tokens():
    # max_model_len 20, prompt 16: tokens 17..20 come one per step; at 20 it finishes
    # (after 4 output tokens, not 10).
    res = _run(
        {"block_size": 4, "num_gpu_blocks": 64, "max_model_len": 20},
        [{"id": "a", "arrival": 0, "max_tokens": 10, "prompt_len": 16}],
    )
    assert res["requests"]["a"]["output_tokens"] == 4
    assert res["requests"]["a"]["finish_step"] == 3


# --- preemption ----------------------------------------------------------------------------


def test_fcfs_preempts_the_last_running_and_skips_admission_that_step():
    # 10 blocks (9 usable), three 40-token prompts of 3 blocks each: all in at step 0. At the
    # 49th token (step 9) r0 needs a 4th block: r2 (last) is preempted, admission skipped.
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 10, "max_num_batched_tokens": 256},
        [{"id": f"r{i}", "arrival": 0, "max_tokens": 40, "prompt_len": 40} for i in range(3)],
    )
    assert _step(res, 0)["free_blocks_after_schedule"] == 0
    s9 = _step(res, 9)
    assert s9["preempted"] == ["r2"] and s9["waiting_stop"] == "preempted_this_step"
    assert s9["alloc_fail"] == [{"id": "r0", "phase": "running", "n": 1, "ok": False}]
    assert s9["queue_waiting"] == ["r2"] and s9["num_computed"]["r2"] == 0
    assert res["requests"]["r2"]["num_preemptions"] >= 1
    assert all(s["finish_step"] is not None for s in res["requests"].values())


def test_a_resumed_request_hits_what_is_left_of_its_cached_blocks():
    # Blocks of 4, 6 usable. a and b: 8-token prompts (2 blocks each) at step 0; their 9th
    # tokens take a 3rd block each at step 1 (pool now empty); step k computes token 8 + k.
    # At step 5 a's 13th token needs a 4th block: b (the last running) is preempted, its 3
    # keyed blocks freed tail-first to the tail (b3, b2, b1), and a's retry takes b3 from the
    # head. a finishes (6 tokens) and frees its 4 blocks. At step 6 b (8 + 5 = 13 tokens)
    # looks up its chain: b1, b2 still cached, b3 gone: it resumes with 8 computed, 5 to go.
    res = _run(
        {"block_size": 4, "num_gpu_blocks": 7, "max_num_batched_tokens": 64},
        [
            {"id": "a", "arrival": 0, "max_tokens": 6, "prompt_len": 8},
            {"id": "b", "arrival": 0, "max_tokens": 9, "prompt_len": 8},
        ],
    )
    assert _step(res, 1)["free_blocks_after_schedule"] == 0
    s5, s6 = _step(res, 5), _step(res, 6)
    assert s5["preempted"] == ["b"] and s5["waiting_stop"] == "preempted_this_step"
    assert _scheduled(s5) == {"a": (1, 12)} and s5["finished"] == ["a"]
    assert s5["free_blocks_after_update"] == 6
    assert s6["resumed"] == [{"id": "b", "n": 5, "computed": 8}]


def test_priority_victim_is_the_highest_priority_value_and_self_preemption_ends_the_step():
    res = _run(
        {
            "block_size": 16,
            "num_gpu_blocks": 9,
            "max_num_batched_tokens": 256,
            "policy": "priority",
            "enable_prefix_caching": False,
        },
        [
            {"id": "lo", "arrival": 0, "priority": 9, "max_tokens": 30, "prompt_len": 48},
            {"id": "mid", "arrival": 1, "priority": 5, "max_tokens": 30, "prompt_len": 48},
            {"id": "hi", "arrival": 3, "priority": 0, "max_tokens": 4, "prompt_len": 30},
        ],
    )
    steps = [s for s in res["steps"] if not s.get("idle")]
    first = next(s for s in steps if s["preempted"])
    # lo runs first in the list, needs a block, is itself the max (9, 0.0): it preempts itself
    # and in 0.32.0 the running pass ends, so mid gets nothing: a 0-token step.
    assert first["preempted"] == ["lo"]
    assert first["total_tokens"] == 0 and first["running"] == []
    assert first["queue_running"] == ["mid"]
    s = res["requests"]
    assert s["hi"]["num_preemptions"] == 0 and s["hi"]["finish_step"] < s["lo"]["finish_step"]


def test_priority_victim_already_scheduled_gives_its_tokens_back():
    sched = Scheduler(
        SchedulerConfig(
            num_gpu_blocks=4,
            max_model_len=64,
            block_size=4,
            max_num_batched_tokens=32,
            max_num_seqs=4,
            policy="priority",
        )
    )
    # a (priority 0) and b (priority 5): 4 tokens each = 1 block each, 3 usable.
    sched.add_request(Request("b", 0, list(range(4)), 8, priority=5, arrival_time=0.0))
    sched.add_request(Request("a", 1, list(range(100, 104)), 8, priority=0, arrival_time=1.0))
    plan = sched.schedule()  # heap order: a first, then b
    assert [e[0] for e in plan.new_entries()] == ["a", "b"]
    sched.update(plan)
    # Now running = [a, b]; both hold 1 block with 5 tokens, 1 block free. Step: a takes the
    # free block. b needs one too: the victim is max (priority, arrival) = b itself.
    plan = sched.schedule()
    assert plan.preempted == ["b"] and [e[0] for e in plan.running_entries()] == ["a"]
    assert plan.total_tokens == 1


def test_priority_waiting_queue_orders_by_priority_then_arrival_then_id():
    q = PriorityQueue()
    for rid, prio, t in [("x", 2, 0.0), ("y", 1, 5.0), ("z", 1, 3.0), ("w", 1, 3.0)]:
        q.add(Request(rid, 0, [1], 1, priority=prio, arrival_time=t))
    assert [r.request_id for r in q] == ["w", "z", "y", "x"]
    f = FcfsQueue()
    f.add(Request("a", 0, [1], 1))
    f.prepend(Request("p", 1, [1], 1))
    assert [r.request_id for r in f] == ["p", "a"]


# --- admission ------------------------------------------------------------------------------

HOL = [
    {"id": "small0", "arrival": 0, "max_tokens": 50, "prompt_len": 100},
    {"id": "big", "arrival": 1, "max_tokens": 2, "prompt_len": 250},
    {"id": "small1", "arrival": 1, "max_tokens": 2, "prompt_len": 10},
]


def test_full_prompt_reservation_blocks_the_head_of_the_line():
    # 19 usable; small0 takes 7 blocks (100 tokens), big needs 16 > 12 free: admission stops
    # there, and small1 behind it waits although it would fit.
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 20, "max_num_batched_tokens": 64}, HOL, num_steps=4
    )
    for s in res["steps"][1:]:
        assert "big" in s["queue_waiting"] and "small1" in s["queue_waiting"]
    s3 = _step(res, 3)
    assert s3["waiting_stop"] == "kv_blocks"
    assert s3["alloc_fail"][-1]["id"] == "big" and s3["alloc_fail"][-1]["phase"] == "waiting"


def test_without_the_reservation_a_big_prompt_is_admitted_chunk_by_chunk():
    res = _run(
        {
            "block_size": 16,
            "num_gpu_blocks": 20,
            "max_num_batched_tokens": 64,
            "scheduler_reserve_full_isl": False,
        },
        HOL,
        num_steps=4,
    )
    assert "big" in [e["id"] for s in res["steps"] for e in s["new"]]


def test_the_watermark_applies_to_admission_only_beside_running_requests():
    # 20 blocks, watermark 0.25 -> 5 blocks. Alone, a (8 blocks of 16 tokens) is admitted with
    # 19 free; b (8 blocks) then needs 8 + 5 > 11 free: refused.
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 20, "watermark": 0.25},
        [
            {"id": "a", "arrival": 0, "max_tokens": 2, "prompt_len": 128},
            {"id": "b", "arrival": 0, "max_tokens": 2, "prompt_len": 128},
        ],
    )
    s0 = _step(res, 0)
    assert [e["id"] for e in s0["new"]] == ["a"] and s0["waiting_stop"] == "kv_blocks"


# --- the step loop ---------------------------------------------------------------------------


def test_one_empty_step_follows_the_last_finish_and_idle_steps_before_arrivals():
    res = _run(
        {"block_size": 16, "num_gpu_blocks": 16},
        [
            {"id": "a", "arrival": 0, "max_tokens": 1, "prompt_len": 5},
            {"id": "b", "arrival": 4, "max_tokens": 1, "prompt_len": 5},
        ],
    )
    kinds = ["idle" if s.get("idle") else s["total_tokens"] for s in res["steps"]]
    # a: 5 tokens and finishes at step 0; step 1 is the empty flush; 2, 3 idle; b at 4; 5 flush.
    assert kinds == [5, 0, "idle", "idle", 5, 0]


def test_config_refuses_what_vllm_refuses():
    with pytest.raises(ValueError):
        SchedulerConfig(
            num_gpu_blocks=10, max_model_len=100, max_num_batched_tokens=8, max_num_seqs=16
        )
    with pytest.raises(ValueError):
        SchedulerConfig(num_gpu_blocks=10, max_model_len=100, policy="lifo")
    with pytest.raises(ValueError):
        SchedulerConfig(num_gpu_blocks=10, max_model_len=100, long_prefill_token_threshold=200)
    cfg = SchedulerConfig(num_gpu_blocks=10, max_model_len=100)
    assert (
        cfg.max_num_batched_tokens,
        cfg.max_num_seqs,
        cfg.block_size,
        cfg.policy,
        cfg.scheduler_reserve_full_isl,
        cfg.enable_prefix_caching,
    ) == (2048, 128, 16, "fcfs", True, True)
