"""The reported inter-token latency is what every token's timestamp gives: random small
workloads under the three engines, each run twice (every iteration in full with a recorder
of every token, :mod:`tests.helpers.itl_truth`; and as a run goes, with closed-form
stretches), their pooled gaps' count, mean, p50, p90, p99 and max held to the recorded
tokens' (exact count; values within floating-point rounding).

The workloads reach every kind of gap: one decode step; a prefill batch that stalls the
decodes (SGLang's loop with mixed chunk off); a preemption and its recompute or swap (a
tight pool, every victim order); retraction and a queued result dropped (SGLang's overlap
loop); requests that do not finish (cancelled, timed out, aborted: their gaps leave the
pool)."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest

from cpkv.admission.schedule_policy.config import SchedulePolicyConfig
from cpkv.serving.cost.model import CostModel
from cpkv.serving.cost.spec import CostSpec
from cpkv.serving.cost.stretch import AffinePieces, Looped
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.engine.sglang_engine import SglangEngine, SglangSettings
from cpkv.serving.engine.simulate import KeepRequests, simulate
from cpkv.serving.engine.vllm_engine import VllmEngine, VllmSettings
from cpkv.serving.input.workload import ServingRequest
from cpkv.serving.model.request import FINISHED, Req
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.serving.record.itl import itl_stats
from cpkv.serving.record.token_gaps import GapLog
from cpkv.serving.schedulers.adder_pass import AdderBudgets
from cpkv.serving.schedulers.options import PolicyOptions
from cpkv.sglang import LoopConfig
from cpkv.vllm.config import SchedulerConfig
from tests.helpers.itl_truth import (
    CpkvTokens,
    SglangTokens,
    VllmTokens,
    finished,
    kinds_of_gaps,
    pooled,
    same,
)

COST = CostModel(
    fixed_us=1000.0, prefill_token_us=20.0, decode_request_us=50.0, context_token_us=0.3
)


def serving_requests(n: int, seed: int, cancels: bool = False) -> list[ServingRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(0.5)
        cancel = rng.choice([None, None, None, rng.uniform(5.0, 80.0)]) if cancels else None
        out.append(
            ServingRequest(
                f"r{i}",
                t,
                rng.randint(20, 300),
                rng.randint(1, 80),
                priority=rng.randint(0, 3),
                cancel_ms=cancel,
            )  # fmt: skip
        )
    return out


def loop_requests(n: int, seed: int) -> list[Req]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(0.5)
        r = Req(i, f"r{i}", t * 1000, rng.randint(20, 300), rng.randint(1, 80))
        r.priority = rng.randint(0, 3)
        out.append(r)
    return out


# -- cpkv's loop ----------------------------------------------------------------------------
def cpkv_settings(policy: str, **changes) -> EngineSettings:
    base = EngineSettings(
        policy=policy, block_size=16, capacity_blocks=60, budget_tokens=256, chunk_tokens=64,
        adder=AdderBudgets(16, 2048, 512), cost=COST, victim="least_progress",
    )  # fmt: skip
    return replace(base, **changes)


PRIORITY = SchedulePolicyConfig(
    enable_priority_scheduling=True, priority_scheduling_preemption_threshold=0
)
CPKV_CASES = {
    "plain": {},
    "roomy": {"capacity_blocks": 400},
    "largest victim": {"victim": "largest_first"},
    "abort": {"on_preempt": "abort"},
    "swap": {"on_preempt": "swap", "options": PolicyOptions(swap=True)},
    "cancel and time out": {"options": PolicyOptions(queue_timeout_ms=40.0, cancellations=True)},
    "priority preemption": {
        "options": PolicyOptions(schedule=PRIORITY, cancellations=True, max_running_requests=4),
        "adder": AdderBudgets(16, 2048, 512, max_running_requests=4),
        "capacity_blocks": 400,
    },
    "graph buckets": {"options": PolicyOptions(cuda_graph_buckets=(1, 2, 4, 8, 16))},
}


def check_cpkv(monkeypatch, requests, settings) -> tuple:
    """Truth from a full run; the reported ITL of it and of a run with stretches."""
    fast = simulate(requests, settings)
    with monkeypatch.context() as patched:
        tokens = CpkvTokens(patched)
        full = simulate(requests, settings, stretches=False)
    for r in full.requests:  # (the recorder saw every token of every request)
        assert len(tokens.stamps.get(r.rid, ())) == r.generated, r
    truth = pooled(tokens.stamps, finished(full.requests))
    same(itl_stats([full.samples]), truth)
    same(itl_stats([fast.samples]), truth)
    assert truth["gaps"] > 100
    return fast, full


@pytest.mark.parametrize("policy", ["prefill_adder", "iteration", "optimistic", "conservative"])
@pytest.mark.parametrize("case", list(CPKV_CASES))
def test_cpkv_loop_gaps_are_its_tokens(monkeypatch, policy, case):
    settings = cpkv_settings(policy, **CPKV_CASES[case])
    cancels = "cancel" in case or "priority" in case
    for seed in range(2):
        requests = serving_requests(40, seed + 10 * len(case), cancels)
        fast, full = check_cpkv(monkeypatch, requests, settings)
        long, withdrawn, lines = kinds_of_gaps(fast.samples)
        assert lines > 0  # the closed-form stretches' gaps were taken
        if any(r.state != FINISHED and r.generated >= 2 for r in full.requests):
            assert withdrawn > 0 or long > 0  # (an unfinished request had gaps)


def test_cpkv_loop_scenarios_reach_every_kind_of_gap():
    """The cases above do preempt (growth and priority) and recompute, abort, cancel and time
    out: their gaps of several iterations and their withdrawals are taken (else the cases
    would prove less)."""
    seen = set()
    for policy, case in (
        ("optimistic", "plain"), ("optimistic", "abort"), ("optimistic", "cancel and time out"),
        ("prefill_adder", "priority preemption"),
    ):  # fmt: skip
        settings = cpkv_settings(policy, **CPKV_CASES[case])
        requests = serving_requests(40, 10 * len(case), "cancel" in case or "priority" in case)
        res = simulate(requests, settings)
        seen |= {r.reject_reason for r in res.requests if r.reject_reason}
        seen |= {f"{key} preemption" for key in res.counters["preemptions"]}
        long, withdrawn, _ = kinds_of_gaps(res.samples)
        seen |= {f"long {case}"} if long else set()
        seen |= {"withdrawn"} if withdrawn else set()
    expected = {
        "kv_growth_decode preemption", "priority preemption", "withdrawn", "preempted",
        "running", "waiting", "long plain", "long priority preemption",
    }  # fmt: skip
    assert expected <= seen, expected - seen


def test_cpkv_loop_two_piece_and_looped_stretches(monkeypatch):
    """Roofline stretches (one or two affine pieces), and a sparse-attention model's (looped
    iteration by iteration)."""
    for spec in (CostSpec(model="llama-3-8b"), CostSpec(model="deepseek-v3.2", tp=8)):
        settings = cpkv_settings("prefill_adder", cost=spec.build(), capacity_blocks=400)
        check_cpkv(monkeypatch, serving_requests(30, 5), settings)


def test_cpkv_loop_gaps_with_arrivals_inside_stretches(monkeypatch):
    """A queue that waits for blocks: arrivals join it inside the stretches (logged in their
    segments), under one- and two-piece roofline stretches and a looped model's."""
    from cpkv.serving.engine import stretch as stretch_module

    taken = []
    original = stretch_module._arrivals_within

    def counted(*args):
        ran = original(*args)
        taken.append(ran)
        return ran

    monkeypatch.setattr(stretch_module, "_arrivals_within", counted)
    for spec, spread in (
        (CostSpec(model="llama-3-8b"), 4.0),
        (CostSpec(model="deepseek-v3.2", tp=8), 40.0),
    ):
        taken.clear()
        settings = cpkv_settings("prefill_adder", cost=spec.build(), capacity_blocks=60)
        requests = [replace(r, arrival_ms=r.arrival_ms * spread) for r in serving_requests(60, 6)]
        check_cpkv(monkeypatch, requests, settings)
        assert sum(1 for ran in taken if ran) >= 3, (spec.model, taken)


# -- SGLang's loop ----------------------------------------------------------------------------
def run_sglang(requests, stretches: bool, **knobs):
    config = LoopConfig(**{"max_total_num_tokens": 2048, "max_running_requests": 64,
                           "context_len": 2048, "chunked_prefill_size": 256, **knobs})  # fmt: skip
    settings = SglangSettings(config, COST, None)
    sink = KeepRequests()
    samples = IterationLog(settings.capacity_blocks, settings.block_size, keep=True, cost=COST)
    engine = SglangEngine(
        settings, sink=sink, samples=samples, arrivals=requests, stretches=stretches
    )
    engine.run()
    return sink.requests, samples


SGLANG_CASES = {
    "roomy": {},
    "tight pool": {"max_total_num_tokens": 700},
    "priority preemption": {
        "enable_priority_scheduling": True,
        "priority_scheduling_preemption_threshold": 0,
        "max_running_requests": 6,
    },  # fmt: skip
}


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("case", list(SGLANG_CASES))
def test_sglang_loop_gaps_are_its_tokens(monkeypatch, overlap, mixed, case):
    knobs = {**SGLANG_CASES[case], "overlap": overlap, "enable_mixed_chunk": mixed}
    for seed in range(3):
        requests = loop_requests(40, seed)
        fast_requests, fast = run_sglang(copy.deepcopy(requests), True, **knobs)
        with monkeypatch.context() as patched:
            tokens = SglangTokens(patched)
            full_requests, full = run_sglang(copy.deepcopy(requests), False, **knobs)
        truth = pooled(tokens.stamps, finished(full_requests))
        same(itl_stats([full]), truth)
        same(itl_stats([fast]), truth)
        long, _, lines = kinds_of_gaps(fast)
        assert lines > 0
        if not mixed or sum(r.preemptions for r in full_requests):
            assert long > 0  # stalled by a prefill batch, or retracted


def test_sglang_loop_scenarios_retract_and_preempt():
    counts = {}
    for case in ("tight pool", "priority preemption"):
        requests, _ = run_sglang(loop_requests(40, 0), True, **SGLANG_CASES[case])
        counts[case] = sum(r.preemptions for r in requests)
    assert all(counts.values()), counts


# -- vLLM ---------------------------------------------------------------------------------------
def run_vllm(requests, fast: bool, monkeypatch=None, **knobs):
    config = SchedulerConfig(**{"num_gpu_blocks": 80, "max_model_len": 512,
                                "max_num_batched_tokens": 128, "max_num_seqs": 16,
                                "block_size": 16, **knobs})  # fmt: skip
    settings = VllmSettings(config, COST, None)
    sink = KeepRequests()
    samples = IterationLog(settings.capacity_blocks, settings.block_size, keep=True, cost=COST)
    engine = VllmEngine(settings, sink=sink, samples=samples, arrivals=requests)
    engine.fast = fast
    tokens = None if monkeypatch is None else VllmTokens(monkeypatch, lambda: engine.now)
    engine.run()
    return sink.requests, samples, tokens


VLLM_CASES = {
    "default": {},
    "tight pool": {"num_gpu_blocks": 40},
    "token budget": {
        "max_num_batched_tokens": 32,
        "max_num_seqs": 16,
        "long_prefill_token_threshold": 8,
    },  # fmt: skip
    "priority": {"policy": "priority"},
}


@pytest.mark.parametrize("case", list(VLLM_CASES))
def test_vllm_gaps_are_its_tokens(monkeypatch, case):
    knobs = VLLM_CASES[case]
    for seed in range(4):
        requests = loop_requests(40, seed)
        _, fast, _ = run_vllm(copy.deepcopy(requests), True, **knobs)
        with monkeypatch.context() as patched:
            full_requests, full, tokens = run_vllm(copy.deepcopy(requests), False, patched, **knobs)
        truth = pooled(tokens.stamps, finished(full_requests))
        same(itl_stats([full]), truth)
        same(itl_stats([fast]), truth)
        long, _, lines = kinds_of_gaps(fast)
        assert lines > 0
        if sum(r.preemptions for r in full_requests):
            assert long > 0  # a recompute's gap spans steps


def test_a_stretchs_gaps_are_its_durations_one_by_one():
    """The gaps of a stretch's first ``steps`` durations are those durations one by one
    (affine pieces, cut at any step, and a looped model's)."""
    pieces = AffinePieces([(0, 10.0, 1.0), (3, 20.0, 0.5), (6, 40.0, 0.25)])
    looped = Looped(CostModel(fixed_us=7.0, decode_request_us=2.0), (0, 3, 5, 0, 0, 0, 0))
    for durations in (pieces, looped):
        for steps in range(1, 10):
            log = GapLog(keep=True)
            log.stretch(100, durations, steps, 3)
            got = [
                (int(g.iteration[i]) + j, float(g.a[i] + g.b[i] * j), int(g.weight[i]))
                for g in log.records()
                for i in range(len(g))
                for j in range(int(g.n[i]))
            ]
            want = [(100 + j, durations.duration(j), 3) for j in range(steps)]
            assert [(i, w) for i, _, w in got] == [(i, w) for i, _, w in want]
            assert [v for _, v, _ in got] == pytest.approx([v for _, v, _ in want], rel=1e-12)
