"""Decode-only steps many at once (:class:`cpkv.vllm.decode.DecodeSteps`) against the same
steps one ``schedule()`` + ``update()`` at a time, on the differential's random scenarios.

Two schedulers take the same requests. Whenever every running request decodes and nothing
can be admitted (the queue is empty, or the last step refused its head for
``max_num_seqs``, or for blocks under ``scheduler_reserve_full_isl``, and finished nothing),
one takes ``k`` steps at once and the other ``k`` steps one by one; each of those steps must
indeed schedule one token per running request, preempt nothing and admit nothing, and
afterwards the two schedulers' whole states must be equal: every request's tokens, computed
tokens, blocks (by id), cached blocks and keys, both queues, the free queue in eviction
order, the prefix-cache map.
"""

from __future__ import annotations

import random

import pytest

from cpkv.vllm import Scheduler, SchedulerConfig
from cpkv.vllm.decode import DecodeSteps
from cpkv.vllm.request import OWN_KEYS, Request, is_own_key
from cpkv.vllm.scenario import prompt_tokens, scenario_config
from cpkv.vllm.scheduler import admission_stop
from tests.vllm.scenarios import make_scenarios

SCENARIOS = make_scenarios(280, seed=7)


def state(sched: Scheduler) -> tuple:
    """Everything the next steps depend on; block keys as the token blocks they stand for
    (the integers they are interned to depend on the order in which they were first seen)."""
    pool = sched.kv.pool
    chunks = {key: item for item, key in sched.kv.keys._ids.items()}

    def tokens_of(key: int) -> tuple:
        if is_own_key(key):  # (a block holding generated tokens: its request's own key)
            return ("own", key - OWN_KEYS)
        out: list = []
        while key != -1:
            key, chunk = chunks[key]
            out.append(chunk)
        return tuple(reversed(out))

    requests = {
        rid: (
            r.status, r.num_tokens, r.num_computed_tokens, list(r.tokens),
            list(r.blocks), r.num_cached_blocks,
            [tokens_of(k) for k in r.block_keys[: r.num_cached_blocks or 0]], r.num_preemptions,
        )
        for rid, r in sched.requests.items()
    }  # fmt: skip
    cached = {  # (a key's blocks in the map's order: a lookup takes the first)
        tokens_of(key): list(blocks) for key, blocks in pool.cached_map().items()
    }
    return (
        requests, [r.request_id for r in sched.running], [r.request_id for r in sched.waiting],
        pool.free_block_ids(), cached, sorted(sched.finished_ids),
    )  # fmt: skip


def add(scheds: list[Scheduler], index: int, spec: dict, step: int) -> None:
    for sched in scheds:
        sched.add_request(
            Request(
                str(spec["id"]), index, prompt_tokens(spec), int(spec.get("max_tokens", 16)),
                int(spec.get("priority", 0)), step + index * 1e-6,
            )
        )  # fmt: skip


def walk(scenario: dict, rng: random.Random) -> int:
    """Run the scenario both ways; how many steps were taken at once."""
    config = SchedulerConfig(**scenario_config(scenario))
    one, many = Scheduler(config), Scheduler(config)
    arrivals: dict[int, list] = {}
    for index, spec in enumerate(scenario["requests"]):
        arrivals.setdefault(int(spec.get("arrival", 0)), []).append((index, spec))
    last = max(arrivals)
    step, jumped, refused = 0, 0, False
    while step < 2000:
        for index, spec in arrivals.get(step, ()):
            add([one, many], index, spec, step)
            refused = False
        if step > last and not one.has_requests():
            break
        steps = DecodeSteps.of(many)
        if steps is not None and (refused or not len(many.waiting)):
            upcoming = min((s for s in arrivals if s > step), default=step + 10**6) - step
            limit = min(steps.to_finish, steps.fitting(many.free_blocks), upcoming)
            if limit >= 1:
                k = rng.randint(1, limit)
                running = [r.request_id for r in one.running]
                for _ in range(k):
                    plan = one.schedule()
                    assert plan.num_scheduled == dict.fromkeys(running, 1)
                    assert not plan.preempted and not plan.admitted
                    finished = one.update(plan)
                finished_many = steps.run(k)
                assert finished_many == finished
                assert state(many) == state(one)
                step += k
                jumped += k
                refused = refused and not finished
                continue
        plan = one.schedule()
        stop = admission_stop(one, plan)
        finished = one.update(plan)
        many.update(many.schedule())
        refused = not finished and (
            stop == "max_num_seqs" or (stop == "kv_blocks" and config.scheduler_reserve_full_isl)
        )
        step += 1
    assert state(many) == state(one)
    return jumped


@pytest.mark.parametrize("chunk", range(4))
def test_decode_steps_at_once_leave_the_state_of_the_steps_one_by_one(chunk: int) -> None:
    rng = random.Random(chunk)
    jumped = sum(walk(s, rng) for s in SCENARIOS[chunk::4])
    assert jumped > 500


def test_fitting_counts_the_steps_whose_blocks_fit() -> None:
    # block size 4; prompts of 4, 5 and 7 tokens prefill in one step (1, 2 and 2 blocks) and
    # sample a token each: 5, 6 and 8 tokens. A step j needs a new block when cdiv(n + j, 4)
    # exceeds the blocks held: steps 0, 3 and 1, then every 4 steps
    config = SchedulerConfig(num_gpu_blocks=64, max_model_len=64, block_size=4)
    sched = Scheduler(config)
    for i, prompt in enumerate((4, 5, 7)):
        sched.add_request(Request(f"r{i}", i, list(range(100 * i, 100 * i + prompt)), 20))
    sched.update(sched.schedule())
    steps = DecodeSteps.of(sched)
    assert steps.first_block == [0, 3, 1] and steps.phases == [1, 1, 0, 1]
    # blocks taken by the first k steps: 1, 2, 2, 3, then one more period of 3 from step 4
    assert [steps.taken(k) for k in (1, 2, 3, 4, 5, 9)] == [1, 2, 2, 3, 4, 7]
    assert [steps.fitting(free) for free in (0, 1, 2, 3, 5)] == [0, 1, 3, 4, 7]
    assert steps.to_finish == 19  # 20 tokens each, one sampled already
    assert steps.context == 5 + 6 + 8


def test_not_decode_only_while_a_prompt_is_computed() -> None:
    config = SchedulerConfig(
        num_gpu_blocks=64, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4
    )
    sched = Scheduler(config)
    sched.add_request(Request("long", 0, list(range(100)), 4))
    sched.update(sched.schedule())  # 64 of 100 prompt tokens
    assert DecodeSteps.of(sched) is None
    sched.update(sched.schedule())  # the last 36: a token sampled
    assert DecodeSteps.of(sched) is not None
