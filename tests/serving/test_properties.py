"""Properties of the serving engine on random workloads, every policy: every request ends
finished or rejected with a reason, the pool never holds more than its capacity and ends
empty, tokens are conserved, times are ordered, the closed-form stretches decide as full
iterations (times within rounding), the O(1) decode step equals the request-by-request one,
and runs are deterministic."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.admission.token_ratio import NewTokenRatio
from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.engine import SimulationStalled
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.engine.simulate import simulate
from cpkv.serving.input.workload import ServingRequest
from cpkv.serving.model.hits import PrefixHits
from cpkv.serving.model.request import FINISHED, REJECTED
from cpkv.serving.record.metrics import request_lines
from cpkv.serving.schedulers.adder_pass import AdderBudgets
from cpkv.trace.prefix_cache import CacheConfig, TieredPrefixCache
from tests.helpers.paths import MOONCAKE_TRACE
from tests.helpers.same_run import assert_same_result


@st.composite
def runs(draw):
    policy = draw(st.sampled_from(["prefill_adder", "conservative", "optimistic", "iteration"]))
    block = draw(st.integers(1, 8))
    chunk = draw(st.one_of(st.none(), st.integers(block, 96)))
    s = EngineSettings(
        policy=policy,
        block_size=block,
        capacity_blocks=1,  # set below, from the requests
        scan=draw(st.sampled_from(["first_fit", "fcfs_stop"])),
        victim=draw(
            st.sampled_from(["scan_order", "newest_first", "largest_first", "least_progress"])
        ),
        on_preempt=draw(st.sampled_from(["requeue", "requeue", "abort"])),
        budget_tokens=draw(st.integers(1, 96)),
        chunk_tokens=draw(st.integers(1, 64)),
        adder=AdderBudgets(
            block,
            draw(st.integers(8, 256)),
            chunk,
            draw(st.one_of(st.none(), st.integers(1, 6))),
            draw(st.one_of(st.none(), st.integers(1, 4))),
            draw(st.integers(0, 16)),
            *draw(st.sampled_from([(None, None, None), (2, 64, 128)])),
        ),
        ratio=NewTokenRatio.from_settings(init_ratio=draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))),
        cost=CostModel(
            draw(st.sampled_from([0.0, 1000.0])),
            draw(st.sampled_from([0.0, 5.0])),
            draw(st.sampled_from([0.0, 20.0])),
            draw(st.sampled_from([0.0, 0.5])),
            1024,
            draw(st.sampled_from([None, 1.0])),
        ),
    )
    use_cache = draw(st.booleans())
    cache_block = draw(st.integers(2, 16))
    reqs = []
    for k in range(draw(st.integers(1, 12))):
        prompt = draw(st.integers(1, 80))
        max_new = draw(st.integers(0, 30))
        arrival = float(draw(st.integers(0, 30)))
        if use_cache:
            family = draw(st.integers(0, 2))
            n = -(-prompt // cache_block)
            shared = draw(st.integers(0, n))
            hashes = tuple(
                [family * 1000 + j for j in range(shared)]
                + [10**6 + k * 100 + j for j in range(n - shared)]
            )
            reqs.append(ServingRequest(f"q{k}", arrival, prompt, max_new, hash_ids=hashes))
        else:
            l1 = draw(st.integers(0, prompt - 1))
            l2 = draw(st.integers(0, prompt - 1 - l1))
            reqs.append(ServingRequest(f"q{k}", arrival, prompt, max_new, l1, l2))
    if draw(st.booleans()):  # tight: the largest request just fits alone
        need = max(-(-(q.prompt_tokens + q.max_new_tokens) // block) for q in reqs)
        cap = need + draw(st.integers(0, 3))
    else:
        cap = draw(st.integers(1, 60))
    s = replace(s, capacity_blocks=cap)
    cache = None
    if use_cache:
        l1 = draw(st.integers(0, 200))
        cache = (
            cache_block,
            CacheConfig(l1_tokens=l1, l2_tokens=draw(st.sampled_from([0, l1 * 2]))),
        )
    return s, reqs, cache


def run(s, reqs, cache, events=False, stretches=True):
    c = TieredPrefixCache(*cache) if cache else None
    return simulate(reqs, s, c, events, stretches)


@settings(max_examples=300, deadline=None)
@given(runs())
def test_serving_invariants(case) -> None:
    s, reqs, cache = case
    try:
        res = run(s, reqs, cache)
    except SimulationStalled as err:
        # admission without a reservation can livelock: requests that fit now but not
        # together re-queue each other forever; the loop must say so, not spin
        assert s.policy != "conservative" and s.on_preempt == "requeue"
        assert "recompute livelock" in str(err) and f"victim order {s.victim}" in str(err)
        return
    cap = s.capacity_blocks
    for r, q in zip(res.requests, reqs, strict=True):
        assert r.state in (FINISHED, REJECTED)
        if r.state == FINISHED:
            assert r.generated == q.max_new_tokens and r.reject_reason is None
            assert q.arrival_ms * 1000 <= r.admitted_us <= r.finished_us
            assert (
                r.first_token_us is None
                if q.max_new_tokens == 0
                else r.admitted_us <= r.first_token_us <= r.finished_us
            )
            if not r.preemptions:  # computed exactly its prompt minus what its cache hits covered
                assert r.prefilled == q.prompt_tokens - r.l1_hit - r.l2_hit
        else:
            assert (
                r.reject_reason in ("exceeds_kv_capacity", "preempted")
                and r.generated <= q.max_new_tokens
            )
        assert (r.recomputed > 0) == (r.preemptions > 0)
    assert max(res.timeline[2], default=0) <= cap and max(res.timeline[3], default=0) <= cap
    c = res.counters
    assert (c["final_used_blocks"], c["final_free_blocks"]) == (0, cap)
    assert c["decode_tokens"] + c["first_tokens"] == sum(r.generated for r in res.requests)
    assert c["prefill_tokens"] == sum(r.prefilled for r in res.requests)
    assert sum(c["preemptions"].values()) == sum(r.preemptions for r in res.requests)
    rejected_preempted = sum(r.reject_reason == "preempted" for r in res.requests)
    assert rejected_preempted == (0 if s.on_preempt == "requeue" else rejected_preempted)


@settings(max_examples=150, deadline=None)
@given(runs())
def test_fast_decode_equals_request_by_request_and_runs_repeat(case) -> None:
    # three runs: closed-form stretches (the default), every iteration in full with the O(1)
    # decode step (stretches=False), every iteration in full request by request (events)
    s, reqs, cache = case
    try:
        fast = run(s, reqs, cache)
    except SimulationStalled as err:
        for kw in ({"stretches": False}, {"events": True}):
            try:
                run(s, reqs, cache, **kw)
            except SimulationStalled as again:
                assert str(again) == str(err)
                continue
            raise AssertionError(f"only the fast path stalled ({kw})") from None
        return
    full = run(s, reqs, cache, stretches=False)
    slow = run(s, reqs, cache, events=True)
    assert_same_result(fast, full)  # the same decisions, times within rel 1e-9
    assert_same_result(full, slow, exact=True)  # the same arithmetic: float for float
    assert request_lines(full) == request_lines(slow)
    assert all(e[3] <= s.capacity_blocks for e in slow.events)
    assert request_lines(run(s, reqs, cache)) == request_lines(fast)


@settings(max_examples=150, deadline=None)
@given(runs())
def test_scans_that_skip_lookups_decide_as_full_lookups(case) -> None:
    s, reqs, cache = case
    if cache is None or s.policy not in ("conservative", "optimistic"):
        return
    try:
        pruned = request_lines(run(s, reqs, cache))
    except SimulationStalled:
        return
    original = PrefixHits.l1_upper
    PrefixHits.l1_upper = lambda self, r: None  # look every request up
    try:
        assert request_lines(run(s, reqs, cache)) == pruned
    finally:
        PrefixHits.l1_upper = original


TRACE = MOONCAKE_TRACE


@pytest.mark.skipif(not TRACE.is_file(), reason="the Mooncake trace is not here")
@pytest.mark.parametrize("policy", ["prefill_adder", "optimistic"])
def test_decode_stretches_change_nothing_on_a_trace_slice(policy) -> None:
    from cpkv.serving.input.workload import ServingWorkload, load_serving_workload
    from cpkv.trace.prefix_cache import CacheConfig as Cache
    from cpkv.workload.sources import WorkloadSpec

    spec = WorkloadSpec(
        source="trace",
        path=str(TRACE),
        limit=400,
        cache=Cache(l1_tokens=300_000, l2_tokens=2_000_000),
    )
    work: ServingWorkload = load_serving_workload(spec, 128)
    s = EngineSettings(
        policy=policy,
        capacity_blocks=20_000,
        victim="least_progress",
        cost=CostModel(fixed_us=2000.0),
    )
    with_stretches = simulate(work.requests, s, work.new_cache())
    assert with_stretches.iterations > 1000
    step_by_step = simulate(work.requests, s, work.new_cache(), stretches=False)
    assert _segments(step_by_step) == step_by_step.iterations  # one segment per iteration
    assert _segments(with_stretches) < step_by_step.iterations  # stretches ran
    assert_same_result(with_stretches, step_by_step)


def _segments(res) -> int:
    """Segments the run's iteration log holds (a stretch is one, whatever its length)."""
    from cpkv.serving.record.segments import SEGMENT

    return sum(len(records) // SEGMENT.size for records, _ in res.samples.read())


def test_a_first_token_preempted_in_its_own_iteration_still_counts() -> None:
    """Found by the property test: q0 gets its first (and last) token, and a later first token
    of the same iteration preempts it. The token was emitted: q0 keeps it, recomputes prompt
    + token after requeueing, and finishes with a first-token time (TTFT), not without one."""
    s = EngineSettings(
        policy="optimistic", block_size=1, capacity_blocks=4, scan="fcfs_stop",
        victim="largest_first", on_preempt="requeue", budget_tokens=2, chunk_tokens=2,
        adder=AdderBudgets(1, 8, None, None, None, 0, None, None, None),
        ratio=NewTokenRatio.from_settings(init_ratio=0.0),
        cost=CostModel(1000.0, 0.0, 0.0, 0.0, 1024, None),
    )  # fmt: skip
    shapes = [(0, 2, 1), (0, 1, 0), (1, 1, 1)] + [(0, 1, 0)] * 6  # (arrival ms, prompt, max_new)
    reqs = [ServingRequest(f"q{k}", float(a), p, m) for k, (a, p, m) in enumerate(shapes)]
    res = run(s, reqs, None)
    q0 = res.requests[0]
    assert q0.state == FINISHED and q0.preemptions >= 1 and q0.generated == 1
    assert q0.first_token_us is not None and q0.admitted_us <= q0.first_token_us <= q0.finished_us
    for r, q in zip(res.requests, reqs, strict=True):
        assert r.state == FINISHED and (r.first_token_us is None) == (q.max_new_tokens == 0)
