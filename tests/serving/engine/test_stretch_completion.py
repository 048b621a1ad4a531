"""A stretch of the block policies may end with the iteration that completes prompts (each
with a whole chunk): the same decisions, times and samples as full iterations, and such
stretches are taken; one whose first tokens would need blocks that are not free stops
before that iteration."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from cpkv.serving.cost.gpus import GPUS
from cpkv.serving.cost.roofline import RooflineCost
from cpkv.serving.cost.shapes import MODELS
from cpkv.serving.engine import engine as engine_module
from cpkv.serving.input.workload import ServingRequest
from tests.serving.engine.test_stretch import same_decisions, settings


def whole_chunk_workload(
    n: int, rate_per_ms: float, seed: int, unit: int = 16
) -> list[ServingRequest]:
    """Prompts and prefix hits in multiples of ``unit`` (of the block, 16), so that with a
    chunk dividing it most prompts end with a whole chunk."""
    rng = random.Random(seed)
    t, requests = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate_per_ms)
        prompt = unit * rng.randint(2, 24)
        l1 = rng.choice([0, 0, unit * rng.randint(0, prompt // (2 * unit))])
        requests.append(ServingRequest(f"r{i}", t, prompt, rng.randint(1, 200), l1, 0))
    return requests


def count_completions(monkeypatch) -> list[int]:
    """How many prompts each stretch-ending completion ends (recorded as the engine runs)."""
    seen: list[int] = []
    original = engine_module.Engine.complete_prompts

    def recorded(self, ended, *args):
        seen.append(len(ended))
        return original(self, ended, *args)

    monkeypatch.setattr(engine_module.Engine, "complete_prompts", recorded)
    return seen


@pytest.mark.parametrize("policy", ["iteration", "optimistic", "conservative"])
@pytest.mark.parametrize("rate", [0.003, 0.03])
def test_a_stretch_ending_with_completed_prompts_decides_as_full_iterations(
    policy, rate, monkeypatch
):
    seen = count_completions(monkeypatch)
    requests = whole_chunk_workload(150, rate, seed=int(rate * 1000) + len(policy))
    same_decisions(requests, settings(policy, chunk_tokens=16, budget_tokens=200))
    assert len(seen) > 20  # taken, often


def test_the_completing_iteration_is_priced_and_logged_as_in_full(monkeypatch):
    """Under the roofline, with chunks long enough that attention's pairs count: its
    duration and its sample are those of the full iteration."""
    seen = count_completions(monkeypatch)
    cost = RooflineCost(MODELS.get("llama-2-7b"), GPUS.get("a100-80gb"))
    requests = whole_chunk_workload(120, 0.002, seed=11, unit=512)
    s = settings("iteration", chunk_tokens=512, budget_tokens=4096, capacity_blocks=20000)
    same_decisions(requests, replace(s, cost=cost))
    assert len(seen) > 20


def test_first_tokens_that_need_blocks_not_free_end_the_stretch_before(monkeypatch):
    """A pool so small that growth preempts: the completing iteration runs in full when its
    first tokens do not fit."""
    checks: list[bool] = []
    original = engine_module.Engine.first_token_room

    def recorded(self, ended, free_blocks):
        checks.append(room := original(self, ended, free_blocks))
        return room

    monkeypatch.setattr(engine_module.Engine, "first_token_room", recorded)
    requests = whole_chunk_workload(80, 0.02, seed=5)
    same_decisions(requests, settings("optimistic", chunk_tokens=16, capacity_blocks=70))
    assert True in checks and False in checks
