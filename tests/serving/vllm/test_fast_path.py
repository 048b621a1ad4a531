"""The vLLM engine's decode-only stretches against every step run in full.

Seeded random workloads (arrivals in bursts and gaps, shared prefixes via ``hash_ids``, pools
so small that running requests are preempted, priorities, ``max_num_seqs`` limits, the
long-prefill cap, prefix caching off, short ``max_model_len``) run twice: with the fast path
and with it forced off. Under a cost model of exactly 1 µs a step (a fixed cost, no other
term), every time is a step count, so first-token and finish *steps* must be equal, exactly;
under a cost model whose steps depend on the batch and the context, the times may differ by
floating-point rounding only (relative 1e-9). Every request's preemptions, hits, tokens and
state, the step count, the counters, and the pool at the end (the free queue in eviction
order, the cached blocks) must be equal.
"""

from __future__ import annotations

import random

import pytest

from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.simulate import KeepRequests
from cpkv.serving.engine.vllm_engine import VllmEngine, VllmSettings
from cpkv.serving.model.request import Req
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.vllm import SchedulerConfig

UNIT = CostModel(fixed_us=1.0, prefill_token_us=0.0, decode_request_us=0.0, context_token_us=0.0)
SHAPED = CostModel(
    fixed_us=731.3, prefill_token_us=0.917, decode_request_us=13.7, context_token_us=0.0213
)
TRACE_BLOCK = 32


def workload(rng: random.Random, count: int, unit: bool) -> list[Req]:
    """Requests in bursts and gaps; a third share one of a few prefixes (trace blocks)."""
    reqs, t = [], 0.0
    scale = 3.0 if unit else 9000.0  # mean gap: a few steps
    for i in range(count):
        t += 0.0 if rng.random() < 0.3 else rng.expovariate(1.0 / scale)
        at = t + (0.5 if unit else 0.0)  # (a unit step never ends exactly at an arrival)
        prompt = rng.choice((rng.randrange(1, 40), rng.randrange(40, 400)))
        hashes = None
        if rng.random() < 0.4:
            family = rng.randrange(3)
            blocks = -(-prompt // TRACE_BLOCK)
            shared = rng.randrange(blocks + 1)
            hashes = tuple(1000 * family + b for b in range(shared)) + tuple(
                10**6 + 1000 * i + b for b in range(blocks - shared)
            )
        new = rng.choice((1, rng.randrange(1, 20), rng.randrange(20, 120)))
        reqs.append(Req(i, f"r{i}", at, prompt, new, hash_ids=hashes, priority=rng.randrange(3)))
    return reqs


def knobs(rng: random.Random) -> dict:
    seqs = rng.choice((2, 4, 8, 64))
    blocks, size = rng.choice((24, 40, 64, 200, 2000)), rng.choice((4, 16))
    longest = min(rng.choice((300, 520)), (blocks - 1) * size)
    return {  # (one request of max_model_len tokens fits the pool, as vLLM requires)
        "num_gpu_blocks": blocks,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": max(seqs, rng.choice((32, 64, 256, 2048))),
        "long_prefill_token_threshold": min(rng.choice((0, 0, 16, 100)), longest),
        "enable_prefix_caching": rng.random() < 0.8,
        "scheduler_reserve_full_isl": rng.random() < 0.8,
        "policy": rng.choice(("fcfs", "priority")),
        "block_size": size,
        "max_model_len": longest,
    }


class Ends(KeepRequests):
    """Keeps every request and the engine's step count when it ended."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = None
        self.steps: dict[str, int] = {}

    def done(self, r: Req) -> None:
        super().done(r)
        self.steps[r.rid] = self.engine.iterations


def run(reqs: list[Req], config: SchedulerConfig, cost, fast: bool):
    fresh = [
        Req(r.index, r.rid, r.arrival_us, r.prompt_tokens, r.max_new_tokens,
                hash_ids=r.hash_ids, priority=r.priority)
        for r in reqs
    ]  # fmt: skip
    settings = VllmSettings(config, cost, trace_block_tokens=TRACE_BLOCK)
    sink = Ends()
    samples = IterationLog(settings.capacity_blocks, config.block_size, keep=True, cost=cost)
    engine = VllmEngine(settings, sink=sink, samples=samples, arrivals=fresh)
    engine.fast = fast
    sink.engine = engine
    full = engine._step
    engine.full_steps = 0

    def counted() -> None:
        engine.full_steps += 1
        full()

    engine._step = counted
    logged = samples.stretch
    engine.waited = 0  # steps jumped while requests waited (their admission refused)

    def stretch(*args) -> None:
        engine.waited += args[1] if args[4] else 0
        logged(*args)

    samples.stretch = stretch
    result = engine.run()
    return engine, result, sink


def pool_state(engine: VllmEngine) -> tuple:
    pool = engine.scheduler.kv.pool
    return pool.free_block_ids(), pool.cached_map()


FIELDS = ("state", "generated", "preemptions", "l1_hit", "recomputed", "prefilled", "reject_reason")
TIMES = ("admitted_us", "first_token_us", "finished_us")


def compare(reqs: list[Req], config: SchedulerConfig, cost, exact: bool) -> None:
    """Run both ways; every difference fails."""
    slow_engine, slow, slow_sink = run(reqs, config, cost, fast=False)
    fast_engine, fast, fast_sink = run(reqs, config, cost, fast=True)
    assert fast.iterations == slow.iterations
    assert fast.counters == slow.counters
    assert fast_sink.steps == slow_sink.steps
    for a, b in zip(slow.samples.kept[2:], fast.samples.kept[2:], strict=True):
        assert a == b  # blocks used and held, running, waiting: step by step
    for a, b in zip(slow_sink.in_input_order(), fast_sink.in_input_order(), strict=True):
        assert a.rid == b.rid
        for name in FIELDS:
            assert getattr(a, name) == getattr(b, name), (a.rid, name)
        for name in TIMES:
            x, y = getattr(a, name), getattr(b, name)
            if exact or x is None or y is None:
                assert x == y, (a.rid, name, x, y)
            else:
                assert y == pytest.approx(x, rel=1e-9, abs=1e-6), (a.rid, name)
    assert pool_state(fast_engine) == pool_state(slow_engine)


@pytest.mark.parametrize("seed", range(60))
def test_fast_path_decides_as_every_step_in_full(seed: int) -> None:
    rng = random.Random(seed)
    config = SchedulerConfig(**knobs(rng))
    unit = seed % 2 == 0
    reqs = workload(rng, rng.randrange(5, 60), unit)
    reqs = [r for r in reqs if r.prompt_tokens < config.max_model_len]
    compare(reqs, config, UNIT if unit else SHAPED, exact=unit)


def test_the_fast_path_jumps_and_preempts_in_these_workloads() -> None:
    """The comparisons above are not vacuous: over the seeds, stretches run (also while
    requests wait), and requests are preempted, hit shared prefixes and finish at
    max_model_len."""
    jumped = waited = preempted = hits = capped = 0
    for seed in range(60):
        rng = random.Random(seed)
        config = SchedulerConfig(**knobs(rng))
        unit = seed % 2 == 0
        reqs = workload(rng, rng.randrange(5, 60), unit)
        reqs = [r for r in reqs if r.prompt_tokens < config.max_model_len]
        engine, result, sink = run(reqs, config, UNIT if unit else SHAPED, fast=True)
        jumped += result.iterations - engine.full_steps
        waited += engine.waited
        done = sink.in_input_order()
        preempted += sum(r.preemptions for r in done)
        hits += sum(1 for r in done if r.l1_hit)
        capped += sum(1 for r in done if r.prompt_tokens + r.generated >= config.max_model_len)
    assert jumped > 1000 and waited > 1000 and preempted > 50 and hits > 50 and capped > 0
