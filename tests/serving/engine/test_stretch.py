"""Closed-form stretches give the decisions of full iterations: every policy, light and
saturated loads, chunked prompts, prefix hits, policy options; and they are taken."""

from __future__ import annotations

import random
import sys
from dataclasses import replace

import pytest

from cpkv.admission.schedule_policy.config import SchedulePolicyConfig
from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine import engine as engine_module
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.engine.simulate import simulate
from cpkv.serving.input.workload import ServingRequest
from cpkv.serving.schedulers.adder_pass import AdderBudgets
from cpkv.serving.schedulers.options import PolicyOptions

REQUEST_FIELDS = (
    "rid", "state", "generated", "prefilled", "preemptions", "recomputed", "l1_hit",
    "l2_hit", "reject_reason",
)  # fmt: skip
TIMES = ("admitted_us", "first_token_us", "finished_us")


def workload(n: int, rate_per_ms: float, prompt: tuple[int, int], out: tuple[int, int], seed: int):
    rng = random.Random(seed)
    t, requests = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate_per_ms)
        p = rng.randint(*prompt)
        l1 = rng.choice([0, 0, p // 2])
        requests.append(
            ServingRequest(f"r{i}", t, p, rng.randint(*out), l1, rng.choice([0, p // 4]))
        )
    return requests


def settings(policy: str, **changes) -> EngineSettings:
    base = EngineSettings(
        policy=policy,
        block_size=16,
        capacity_blocks=400,
        budget_tokens=256,
        chunk_tokens=64,
        adder=AdderBudgets(16, 2048, 512),
        cost=CostModel(fixed_us=2000.0, prefill_token_us=20.0, decode_request_us=15.0),
        victim="least_progress",
    )
    return replace(base, **changes)


def same_decisions(requests, s: EngineSettings) -> tuple:
    fast = simulate(requests, s)
    full = simulate(requests, s, stretches=False)
    assert fast.iterations == full.iterations
    ratio = "final_new_token_ratio"
    assert fast.counters[ratio] == pytest.approx(full.counters[ratio], rel=1e-12)
    assert {**fast.counters, ratio: 0} == {**full.counters, ratio: 0}
    assert len(fast.requests) == len(full.requests)
    for a, b in zip(fast.requests, full.requests, strict=True):
        assert [getattr(a, f) for f in REQUEST_FIELDS] == [getattr(b, f) for f in REQUEST_FIELDS]
        for f in TIMES:
            x, y = getattr(a, f), getattr(b, f)
            assert (x is None) == (y is None)
            if x is not None:
                assert x == pytest.approx(y, rel=1e-9, abs=1e-6)
    assert fast.end_us == pytest.approx(full.end_us, rel=1e-9)
    for column_a, column_b in zip(fast.timeline, full.timeline, strict=True):
        assert column_a == pytest.approx(column_b, rel=1e-9, abs=1e-6)
    return fast, full


@pytest.mark.parametrize("policy", ["prefill_adder", "conservative", "optimistic", "iteration"])
@pytest.mark.parametrize("load", ["light", "saturated"])
def test_stretches_decide_as_full_iterations(policy, load):
    rate = 0.002 if load == "light" else 0.05
    requests = workload(120, rate, (50, 700), (1, 300), seed=len(policy) + len(load))
    same_decisions(requests, settings(policy))


@pytest.mark.parametrize("policy", ["prefill_adder", "iteration", "optimistic"])
def test_stretches_decide_as_full_iterations_with_a_tight_pool(policy):
    """A pool so small that growth preempts: stretches stop before a step that does not fit."""
    requests = workload(60, 0.01, (100, 400), (50, 400), seed=7)
    same_decisions(requests, settings(policy, capacity_blocks=90))


def test_stretches_decide_as_full_iterations_with_policy_options():
    opts = PolicyOptions(
        schedule=SchedulePolicyConfig(schedule_policy="lof"),
        queue_timeout_ms=400.0,
        safety_margin_blocks=8,
    )
    requests = workload(100, 0.03, (50, 600), (1, 200), seed=3)
    for policy in ("prefill_adder", "iteration", "conservative"):
        same_decisions(requests, settings(policy, options=opts))


def test_stretches_are_taken(monkeypatch):
    """Most iterations of a light load run in closed form (a test that fails if the engine
    stops using stretches), and a saturated prefill_adder queue gets them too."""
    full = []
    original = engine_module.Engine._iteration

    def counted(self):
        full.append(1)
        return original(self)

    monkeypatch.setattr(engine_module.Engine, "_iteration", counted)
    for policy in ("prefill_adder", "iteration"):
        for rate in (0.002, 0.05):
            full.clear()
            res = simulate(workload(100, rate, (200, 300), (100, 200), seed=1), settings(policy))
            assert len(full) < res.iterations / 3, (policy, rate, len(full), res.iterations)


def test_arrivals_join_a_waiting_queue_inside_a_stretch(monkeypatch):
    """A saturated prefill_adder queue: arrivals that find requests waiting join the queue
    inside stretches (the stretches do not end at them), and the decisions, times and
    timeline are those of full iterations."""
    inside = []
    original = engine_module.Engine.arrive
    from cpkv.serving.engine import stretch as stretch_module

    def counted(self):
        inside.append(sys._getframe(1).f_code is stretch_module._arrivals_within.__code__)
        return original(self)

    monkeypatch.setattr(engine_module.Engine, "arrive", counted)
    requests = workload(150, 0.05, (200, 300), (100, 200), seed=4)
    fast, _full = same_decisions(requests, settings("prefill_adder"))
    assert sum(inside) > len(requests) / 3, (sum(inside), len(inside))


def test_arrivals_end_a_stretch_when_the_scheduler_reads_the_whole_queue(monkeypatch):
    """A scanning policy (conservative) may admit a later request: an arrival ends the
    stretch, never joins inside one."""
    from cpkv.serving.engine import stretch as stretch_module

    called = []
    original = stretch_module._arrivals_within

    def counted(*args):
        called.append(1)
        return original(*args)

    monkeypatch.setattr(stretch_module, "_arrivals_within", counted)
    requests = workload(150, 0.05, (200, 300), (100, 200), seed=4)
    same_decisions(requests, settings("conservative"))
    assert not called


@pytest.mark.parametrize("chunk", [16, 64, 256])
def test_admissions_that_join_the_lane_run_in_stretches(monkeypatch, chunk):
    """`iteration`: an iteration whose admissions each compute a whole chunk and have more
    left is the first of a stretch (the requests join the lane), with the decisions, times
    and timeline of full iterations; a chunk the budget cannot give whole (256 of a budget
    of 256 less the decode rows) is never taken so."""
    joined, full = [], []
    join_lane, iteration = engine_module.Engine.join_lane, engine_module.Engine._iteration

    def counted_join(self, joins):
        joined.append(len(joins))
        return join_lane(self, joins)

    def counted_iteration(self):
        full.append(1)
        return iteration(self)

    rng = random.Random(11)
    t, requests = 0.0, []
    for i in range(150):
        t += rng.expovariate(0.01)
        requests.append(ServingRequest(f"r{i}", t, 64 * rng.randint(2, 10), rng.randint(20, 200)))
    s = settings("iteration", chunk_tokens=chunk, capacity_blocks=2000)
    monkeypatch.setattr(engine_module.Engine, "join_lane", counted_join)
    same_decisions(requests, s)
    monkeypatch.setattr(engine_module.Engine, "_iteration", counted_iteration)
    joined.clear()
    simulate(requests, s)
    if chunk == 256:
        assert not joined
    else:
        assert sum(joined) > len(requests) / 2, (chunk, sum(joined))
        assert len(full) < len(requests) / 2, (chunk, len(full))
