"""``cpkv admit`` on a vLLM queue (``admit.mode: passes``, ``admit.engine: vllm``).

The queue's steps are checked against the vLLM oracle's scenario format run by
:func:`cpkv.vllm.run_scenario` on the same requests written as token segments: a trace
request's ``hash_ids`` become named segments of the trace block's tokens, so two requests
share exactly the blocks their hash ids share. The two paths name blocks differently (the
serving requests' block names, the scenario's token ids), so equal records also check that
the names share what the tokens share. Then the files and the refusals.
"""

from __future__ import annotations

import json
import random

import pytest

from cpkv.admit.vllm_passes import run_queue
from cpkv.serving.engine.vllm_engine import BlockNames
from cpkv.serving.model.request import Req
from cpkv.vllm import SchedulerConfig, run_scenario
from cpkv.vllm.request import Request

TRACE_BLOCK = 64


def trace_requests(rng: random.Random, count: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """(prompt, max_tokens, hash_ids): a few families sharing leading trace blocks, and some
    that share later ids only (a block is shared only with its whole prefix)."""
    out = []
    for i in range(count):
        prompt = rng.randrange(1, 700)
        blocks = -(-prompt // TRACE_BLOCK)
        family = rng.randrange(3)
        shared = rng.randrange(blocks + 1) if rng.random() < 0.7 else 0
        hashes = tuple(100 * family + b for b in range(shared)) + tuple(
            10_000 + 100 * i + b for b in range(blocks - shared)
        )
        if rng.random() < 0.4:  # the same later ids after a first block of its own: no hit
            hashes = (20_000 + i, *(500 + b for b in range(1, blocks)))
        out.append((prompt, rng.randrange(1, 40), hashes))
    return out


def segments(prompt: int, hashes: tuple[int, ...]) -> list[list]:
    out, left = [], prompt
    for h in hashes:
        out.append([f"h{h}", min(TRACE_BLOCK, left)])
        left -= TRACE_BLOCK
    return out


def knobs(rng: random.Random) -> dict:
    seqs = rng.choice((2, 4, 16))
    return {
        "num_gpu_blocks": rng.choice((60, 90, 400)),
        "max_num_seqs": seqs,
        "max_num_batched_tokens": rng.choice((64, 256, 1024)),
        "long_prefill_token_threshold": rng.choice((0, 48)),
        "enable_prefix_caching": rng.random() < 0.85,
        "scheduler_reserve_full_isl": rng.random() < 0.7,
        "policy": rng.choice(("fcfs", "priority")),
        "max_model_len": 800,
    }


def queue_records(config: SchedulerConfig, reqs: list[tuple], priorities: list[int]):
    requests = []
    for i, (prompt, new, hashes) in enumerate(reqs):
        r = Req(i, f"r{i}", 0.0, prompt, new, hash_ids=hashes)
        requests.append(
            Request.sized(
                r.rid, i, prompt, new, BlockNames(r, config.block_size, TRACE_BLOCK),
                priorities[i], float(i),
            )
        )  # fmt: skip
    lines: list[str] = []
    rows, totals = run_queue(config, requests, lines.append)
    return [json.loads(line) for line in lines], rows, totals


FIELDS = ("new", "resumed", "running", "preempted", "total_tokens", "token_budget_left",
          "waiting_stop", "free_blocks_after_schedule", "finished", "free_blocks_after_update")  # fmt: skip


@pytest.mark.parametrize("seed", range(30))
def test_the_queue_steps_as_the_scenario_of_the_same_requests(seed: int) -> None:
    rng = random.Random(seed)
    given = knobs(rng)
    if given["max_num_batched_tokens"] < given["max_num_seqs"]:
        given["max_num_seqs"] = given["max_num_batched_tokens"]
    reqs = trace_requests(rng, rng.randrange(2, 14))
    priorities = [rng.randrange(3) for _ in reqs]
    records, rows, totals = queue_records(SchedulerConfig(**given), reqs, priorities)
    # the scenario: step k's arrival time is k + index * 1e-6 (all at step 0: the index)
    scenario = run_scenario({
        "config": given,
        "requests": [
            {"id": f"r{i}", "arrival": 0, "max_tokens": new, "priority": priorities[i],
             "segments": segments(prompt, hashes)}
            for i, (prompt, new, hashes) in enumerate(reqs)
        ],
    })  # fmt: skip
    steps = [
        s
        for s in scenario["steps"]
        if not s.get("idle") and s["total_tokens"] + len(s["preempted"])
    ]
    assert len(records) == len(steps) == len(rows) == totals["ticks"]
    for rec, step in zip(records, steps, strict=True):
        rec["finished"] = sorted(rec["finished"])  # (the scenario's record sorts them)
        for name in FIELDS:
            assert rec[name] == step[name], (seed, rec["tick"], name)
    summary = scenario["requests"]
    assert totals["preemptions"] == sum(s["num_preemptions"] for s in summary.values())
    assert totals["prefix_hit_tokens"] == sum(s["prefix_hit_tokens"] for s in summary.values())
    assert totals["requests_finished"] == len(reqs)


def test_the_queue_shares_prefixes_and_preempts_in_these_cases() -> None:
    hits = preempted = 0
    for seed in range(30):
        rng = random.Random(seed)
        given = knobs(rng)
        if given["max_num_batched_tokens"] < given["max_num_seqs"]:
            given["max_num_seqs"] = given["max_num_batched_tokens"]
        reqs = trace_requests(rng, rng.randrange(2, 14))
        _, _, totals = queue_records(SchedulerConfig(**given), reqs, [0] * len(reqs))
        hits += totals["prefix_hit_tokens"] > 0
        preempted += totals["preemptions"] > 0
    assert hits >= 10 and preempted >= 3


def test_a_queue_run_writes_one_row_and_one_line_per_step(cli) -> None:
    res = cli("admit", "configs/admit/vllm_queue.yaml")
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    rows = cli.results(run)["rows"]
    lines = (run / "ticks.jsonl").read_text().splitlines()
    summary = json.loads((run / "results.json").read_text())["summary"]
    assert len(rows) == len(lines) == summary["ticks"]
    assert summary["requests_finished"] == summary["requests"] == 6
    # r1 shares r0's first two trace blocks (128 tokens) and is admitted beside it
    first = json.loads(lines[0])
    assert {e["id"]: (e["n"], e["computed"]) for e in first["new"]} == {
        "r0": (200, 0),
        "r1": (72, 128),
    }


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("admit.arrivals.process=poisson", "admit.arrivals: mode passes runs the queue"),
        ("admit.cost.kind=linear", "admit.cost: mode passes runs the queue"),
        ("admit.available_tokens=100", "admit.available_tokens: 100 is a budget of SGLang's"),
        ("admit.policy=conservative", "admit.policy: 'conservative' is SGLang's"),
        ("admit.vllm.policy=lifo", "admit.vllm.policy"),
        ("admit.vllm.max_num_seqs=-1", "admit.vllm.max_num_seqs"),
        ("admit.vllm.block_size=x", "admit.vllm.block_size"),
        ("admit.vllm.max_num_seq=4", "admit.vllm.max_num_seq: unknown key"),
    ],
)
def test_bad_queue_config_is_one_line(cli, override, message) -> None:
    res = cli("admit", "configs/admit/vllm_queue.yaml", override)
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1
    assert not cli.run_dirs()


def test_fixed_cached_tokens_are_refused_in_one_line(cli) -> None:
    # the default grid's requests carry L1/L2 hits, which vLLM finds in its own cache
    res = cli("admit", "admit.engine=vllm", "admit.kv.capacity_blocks=4096")
    assert res.exit_code == 2, res.output
    assert "has fixed cached tokens" in res.output and len(res.output.strip().splitlines()) == 1
