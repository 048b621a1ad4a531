"""Seed 004's "common errors" as invariants (cpkv.serving.engine.invariants), checked after
every iteration on random workloads over the whole policy space; and, for each invariant, a
bug planted in the engine that the same property then catches (Hypothesis finds a workload
on which the check fails, naming that invariant)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from cpkv.admission.schedule_policy import SchedulePolicyConfig
from cpkv.admission.token_ratio import NewTokenRatio
from cpkv.policies.budgets import TokenWeights
from cpkv.policies.profiled import ProfiledSpec
from cpkv.serving.cost.graph_padding import PaddedDecodeCost
from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.engine import SimulationStalled
from cpkv.serving.engine.invariants import InvariantViolation
from cpkv.serving.engine.lifecycle import Lifecycle
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.engine.simulate import simulate
from cpkv.serving.input.workload import ServingRequest
from cpkv.serving.model.kv_pool import KvPool
from cpkv.serving.model.request import CANCELLED, FINISHED, REJECTED, TIMED_OUT
from cpkv.serving.schedulers.adder_pass import AdderBudgets
from cpkv.serving.schedulers.budget import TokenBudget
from cpkv.serving.schedulers.options import PolicyOptions
from cpkv.trace.prefix_cache import CacheConfig, TieredPrefixCache

TERMINAL = (FINISHED, REJECTED, TIMED_OUT, CANCELLED)


@st.composite
def runs(draw):
    policy = draw(
        st.sampled_from(["prefill_adder", "conservative", "optimistic", "iteration", "profiled"])
    )
    block = draw(st.integers(1, 6))
    order = draw(
        st.sampled_from(
            [
                "fcfs",
                "deadline",
                "lof",
                "random",
                "lpm",
                "dfs-weight",
                "hrrn",
                "shortest-prefill-first",
            ]
        )
    )
    if policy != "prefill_adder" and order != "deadline":
        order = "fcfs"
    priority = policy == "prefill_adder" and order in ("fcfs", "lof") and draw(st.booleans())
    schedule = SchedulePolicyConfig(
        schedule_policy="fcfs" if order == "deadline" else order,
        enable_priority_scheduling=priority,
        schedule_low_priority_values_first=draw(st.booleans()),
        priority_scheduling_preemption_threshold=draw(st.sampled_from([0, 10])),
    )
    max_running = draw(st.one_of(st.none(), st.integers(1, 4)))
    buckets = draw(st.sampled_from([(), (1, 2, 4, 8)]))
    opts = PolicyOptions(
        schedule=schedule,
        deadline_aging_ms=draw(st.sampled_from([5.0, 50.0])) if order == "deadline" else None,
        slo_ttft_ms=draw(st.sampled_from([None, 20.0])) if order == "deadline" else None,
        profiled=ProfiledSpec(draw(st.sampled_from([0.0, 0.5, 0.9])), draw(st.integers(1, 5)), draw(st.sampled_from([None, 0, 3])))
        if policy == "profiled" else None,
        weights=TokenWeights(*draw(st.sampled_from([(1.0, 1.0, 1.0), (2.0, 1.0, 0.5), (1.0, 3.0, 1.0)])))
        if policy != "prefill_adder" else TokenWeights(),
        verify_tokens=draw(st.integers(0, 2)) if policy != "prefill_adder" else 0,
        max_running_requests=max_running if policy != "prefill_adder" else None,
        safety_margin_blocks=draw(st.integers(0, 2)),
        swap=draw(st.booleans()),
        queue_timeout_ms=draw(st.sampled_from([None, 3.0, 15.0])),
        check_invariants=True,
        cuda_graph_buckets=buckets,
        seed=draw(st.integers(0, 3)),
    )  # fmt: skip
    cost = CostModel(
        1000.0,
        draw(st.sampled_from([0.0, 5.0])),
        20.0,
        0.5,
        1024,
        draw(st.sampled_from([None, 1.0])),
    )
    chunk = draw(st.one_of(st.none(), st.integers(block, 64)))
    s = EngineSettings(
        policy=policy, block_size=block, capacity_blocks=1,
        scan=draw(st.sampled_from(["first_fit", "fcfs_stop"])),
        victim=draw(st.sampled_from(["scan_order", "newest_first", "largest_first", "least_progress"])),
        on_preempt="swap" if opts.swap else draw(st.sampled_from(["requeue", "requeue", "abort"])),
        budget_tokens=draw(st.integers(4, 64)), chunk_tokens=draw(st.integers(1, 32)),
        adder=AdderBudgets(block, draw(st.integers(8, 128)), chunk, max_running, None, draw(st.integers(0, 8))),
        ratio=NewTokenRatio.from_settings(init_ratio=draw(st.sampled_from([0.3, 0.7]))),
        cost=PaddedDecodeCost(cost, buckets) if buckets else cost,
        stall_iterations=200, options=opts,
    )  # fmt: skip
    use_cache = draw(st.booleans())
    cache_block = draw(st.integers(2, 8))
    reqs = []
    for k in range(draw(st.integers(1, 10))):
        prompt, max_new = draw(st.integers(1, 40)), draw(st.integers(0, 16))
        fields = {
            "priority": draw(st.sampled_from([None, 0, 5, 50])),
            "deadline_ms": draw(st.sampled_from([None, 2.0, 30.0])),
            "cancel_ms": draw(st.sampled_from([None, None, 1.5, 6.0, 25.0])),
        }
        arrival = float(draw(st.integers(0, 20)))
        if use_cache:
            n = -(-prompt // cache_block)
            shared = draw(st.integers(0, n))
            family = draw(st.integers(0, 2))
            hashes = tuple(
                [family * 1000 + j for j in range(shared)]
                + [10**6 + k * 100 + j for j in range(n - shared)]
            )
            reqs.append(
                ServingRequest(f"q{k}", arrival, prompt, max_new, hash_ids=hashes, **fields)
            )
        else:
            l1 = draw(st.integers(0, prompt - 1))
            reqs.append(ServingRequest(f"q{k}", arrival, prompt, max_new, l1, 0, **fields))
    need = max(-(-(q.prompt_tokens + q.max_new_tokens) // block) for q in reqs)
    cap = need + opts.safety_margin_blocks + draw(st.integers(0, 6))
    from dataclasses import replace

    s = replace(s, capacity_blocks=cap)
    cache = (
        (cache_block, CacheConfig(l1_tokens=draw(st.integers(0, 64)), l2_tokens=64))
        if use_cache
        else None
    )
    return s, reqs, cache


def run(case):
    s, reqs, cache = case
    try:
        return simulate(reqs, s, TieredPrefixCache(*cache) if cache else None)
    except SimulationStalled:
        return None  # a recompute livelock, said so (tests/serving/test_properties.py)


@settings(max_examples=250, deadline=None)
@given(runs())
def test_invariants_hold_over_the_policy_space(case) -> None:
    res = run(case)
    if res is None:
        return
    _, reqs, _ = case
    for r, q in zip(res.requests, reqs, strict=True):
        assert r.state in TERMINAL  # exactly one terminal state each
        if r.state in (TIMED_OUT, CANCELLED):
            assert r.reject_reason in ("waiting", "prefilling", "running")
        if r.state == FINISHED:
            assert r.generated == q.max_new_tokens
    c = res.counters
    s = case[0]
    assert c["final_used_blocks"] == 0
    assert c["final_free_blocks"] == s.capacity_blocks - s.options.safety_margin_blocks


# -- planted bugs: each invariant catches its error --------------------------------------------


def _ignore_decodes(
    self, decoded
):  # "token budget exceeded: every decode and prefill in one round"
    return self.budget_tokens


def _first_token_without_kv(original):  # the first token's KV slot not counted
    def grow(self, r, others):
        grew = original(self, r, others)
        if grew:
            r.kv_tokens -= 1
        return grew

    return grow


def _release_keeps_a_block(self, r, kv):  # a freed request keeps a block (refcount leak)
    blocks = -(-kv // self.block_size)
    self.free_blocks += max(blocks, r.reserved_blocks) - (1 if blocks else 0)
    self.used_blocks -= blocks
    r.reserved_blocks = 0


def _requeue_forgets_outputs(original):  # a recompute victim's generated tokens not refilled
    def requeued(self, r):
        original(self, r)
        r.fill_tokens = r.prompt_tokens

    return requeued


def _timeout_stays_queued(self, r):  # a timed-out request left in the scheduler's queue
    r.state, r.reject_reason, r.finished_us = TIMED_OUT, "waiting", self.engine.now
    self.engine.ended(r)


def _take_in_characters(original):  # KV counted in characters (~4 a token), not tokens
    def take(self, r, kv, reserve):
        original(self, r, kv * 4, reserve)

    return take


PLANTED = {
    "token_budget": [(TokenBudget, "prefill_tokens", _ignore_decodes)],
    "first_token": [(KvPool, "grow_first_token", _first_token_without_kv(KvPool.grow_first_token))],
    "blocks": [(KvPool, "_release", _release_keeps_a_block)],
    "recompute": [(Lifecycle, "requeued", _requeue_forgets_outputs(Lifecycle.requeued))],
    "terminal": [(Lifecycle, "time_out", _timeout_stays_queued)],
    "tokens": [(KvPool, "take", _take_in_characters(KvPool.take))],
}


def _fails_with(name):
    def predicate(case) -> bool:
        try:
            run(case)
        except InvariantViolation as err:
            return f"invariant {name} " in str(err)
        except Exception:  # noqa: BLE001 - a planted bug may break the loop some other way
            return False
        return False

    return predicate


@pytest.mark.parametrize("name", list(PLANTED))
def test_each_invariant_catches_its_planted_bug(monkeypatch, name) -> None:
    for owner, attribute, bug in PLANTED[name]:
        monkeypatch.setattr(owner, attribute, bug)
    example = find(
        runs(), _fails_with(name),
        settings=settings(max_examples=2000, deadline=None, database=None, phases=[Phase.generate],
                          suppress_health_check=list(HealthCheck)),  # no shrinking: found is enough
    )  # fmt: skip
    assert example is not None
