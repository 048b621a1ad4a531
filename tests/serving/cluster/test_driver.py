"""The cluster driver (cpkv.serving.cluster.driver): loads a router sees at arrival time,
derived by hand on a flat cost model, and one instance = the plain run."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from cpkv.serving.cluster.driver import Cluster, InstanceColumns, InstanceTally
from cpkv.serving.cluster.routers import InstanceLoad, RouterSettings
from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.engine import Engine
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.model.request import Req
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.serving.record.requests import RequestStats
from cpkv.serving.schedulers.adder_pass import AdderBudgets
from cpkv.serving.schema import SloSpec

FLAT_1MS = CostModel(
    fixed_us=1000.0, prefill_token_us=0.0, decode_request_us=0.0, context_token_us=0.0,
    l2_load_gb_per_s=None,
)  # fmt: skip
"""Every iteration takes exactly 1 ms, whatever it does."""


def _settings(**kw) -> EngineSettings:
    return EngineSettings(
        block_size=16, capacity_blocks=kw.pop("capacity_blocks", 1024),
        adder=AdderBudgets(16, 16384, 8192), cost=kw.pop("cost", FLAT_1MS), **kw,
    )  # fmt: skip


def _req(i: int, at_ms: float, prompt: int = 16, max_new: int = 1, hashes=None) -> Req:
    return Req(i, f"q{i}", at_ms * 1000.0, prompt, max_new, 0, 0, hashes)


def _cluster(n: int, router: str, settings: EngineSettings, caches=None, write=None):
    total = RequestStats(SloSpec(), write)
    tallies = [InstanceTally(k, total, RequestStats(SloSpec())) for k in range(n)]
    sims = [
        Engine(settings, None if caches is None else caches[k], sink=tallies[k],
               samples=IterationLog(settings.capacity_blocks, settings.block_size, keep=True,
                                    cost=settings.cost))
        for k in range(n)
    ]  # fmt: skip
    return Cluster(sims, tallies, router, RouterSettings(), 0, 512), total


class Spy:
    """Records what the router was shown, then lets it decide."""

    def __init__(self, router) -> None:
        self.router, self.seen = router, []

    def route(self, request, loads, now_ms):
        decision = self.router.route(request, loads, now_ms)
        self.seen.append((request.rid, now_ms, list(loads), decision.instance))
        return decision


def test_least_requests_sees_outstanding_requests_at_arrival_time():
    # Iterations take 1 ms. q0 (t=0, 5 tokens) -> instance 0 (tie, lowest): first token at
    # 1 ms, tokens 2..5 at 2..5 ms, finished at 5 ms. q1 (t=0.5, 1 token) -> instance 1 (0 vs
    # 1): its iteration runs [0.5, 1.5), finished at 1.5. q2 (t=1.2): instance 1's iteration
    # is in flight, q1 is still outstanding there -> loads 1 and 1 -> instance 0 (tie). q3
    # (t=1.6): q1 ended at 1.5 -> loads 2 (q0 running, q2 delivered at 1.2 but instance 0's
    # iteration [1, 2) started before: q2 not in the loop yet, queued) and 0 -> instance 1.
    # q4 (t=5.0): instance 0 ended q0 at 5.0 (not after 5.0: not outstanding); q2 joined at
    # 2 ms, first token at 3 ms, its 1 token: finished at 3 -> instance 0 holds 0; instance 1
    # took q3 at 1.6: [1.6, 2.6) -> finished -> 0 and 0 -> instance 0.
    cluster, total = _cluster(2, "least_requests", _settings())
    spy = cluster.router = Spy(cluster.router)
    reqs = [_req(0, 0.0, max_new=5), _req(1, 0.5), _req(2, 1.2), _req(3, 1.6), _req(4, 5.0)]
    run = cluster.run(reqs)
    total.close()
    assert [(rid, instance) for rid, _, _, instance in spy.seen] == [
        ("q0", 0),
        ("q1", 1),
        ("q2", 0),
        ("q3", 1),
        ("q4", 0),
    ]
    loads = {rid: loads for rid, _, loads, _ in spy.seen}
    assert loads["q0"] == [InstanceLoad(0, 0), InstanceLoad(0, 0)]
    assert loads["q1"] == [InstanceLoad(0, 1), InstanceLoad(0, 0)]
    assert loads["q2"] == [InstanceLoad(0, 1), InstanceLoad(0, 1)]
    assert loads["q3"] == [InstanceLoad(1, 1), InstanceLoad(0, 0)]
    assert loads["q4"] == [InstanceLoad(0, 0), InstanceLoad(0, 0)]
    assert run.instance_of == [0, 1, 0, 1, 0]
    assert run.router.per_instance == [3, 2]
    assert [t.routed for t in run.tallies] == [3, 2]
    assert run.end_us == 6000.0  # q4 (t=5) runs [5, 6)


def test_least_tokens_counts_prompt_plus_tokens_emitted_by_then():
    # Prompts of 16 tokens. q0 (t=0, 4 tokens) -> instance 0. q1 (t=1.5, prompt 100, 1
    # token) -> tokens at 1.5: instance 0 runs its iteration [1, 2) (q0's 2nd token, not
    # out before 2): 16 + 1 = 17 running; instance 1: 0 -> instance 1. q2 (t=1.7): instance
    # 1's iteration [1.5, 2.5) is in flight: q1 (prompt 100) is running for the router
    # (its first token comes at 2.5: 100 + 0); instance 0: 17 -> instance 0: 17 < 100.
    cluster, total = _cluster(2, "least_tokens", _settings())
    spy = cluster.router = Spy(cluster.router)
    run = cluster.run([_req(0, 0.0, max_new=4), _req(1, 1.5, prompt=100), _req(2, 1.7)])
    total.close()
    loads = {rid: loads for rid, _, loads, _ in spy.seen}
    assert loads["q1"] == [InstanceLoad(0, 1, 0, 17), InstanceLoad(0, 0, 0, 0)]
    assert loads["q2"] == [InstanceLoad(0, 1, 0, 17), InstanceLoad(0, 1, 0, 100)]
    assert run.instance_of == [0, 1, 0]


def test_prefix_aware_sends_a_shared_prefix_to_its_instance():
    # Trace blocks of 512 tokens. q0 (blocks 1,2,3) -> empty tree: a miss, smallest tree
    # (both 0) -> instance 0. q1 (blocks 7,8) -> miss -> instance 1 (its tree is empty,
    # instance 0 holds 3 blocks). q2 (blocks 1,2,9: 2 of 3 blocks match, 1024 / 1536 = 0.67
    # > 0.3) -> instance 0 (cache hit). q3 (blocks 7,5,6: 512 / 1536 = 0.33 > 0.3) ->
    # instance 1. Loads stay far below the balance threshold (64).
    cluster, total = _cluster(2, "prefix_aware", _settings(capacity_blocks=4096))
    reqs = [
        _req(0, 0.0, 1536, hashes=(1, 2, 3)), _req(1, 0.1, 1024, hashes=(7, 8)),
        _req(2, 0.2, 1536, hashes=(1, 2, 9)), _req(3, 0.3, 1536, hashes=(7, 5, 6)),
    ]  # fmt: skip
    run = cluster.run(reqs)
    total.close()
    assert run.instance_of == [0, 1, 0, 1]
    assert run.router.by_rule == {"cache_miss": 2, "cache_hit": 2}
    assert run.router.moved_by_balance == 0


def test_round_robin_lines_carry_the_instance():
    parts: list[str] = []
    cluster, total = _cluster(3, "round_robin", _settings())
    total.write, total.columns = parts.append, InstanceColumns(cluster.instance_of)
    cluster.run([_req(i, 0.1 * i) for i in range(7)])
    total.close()
    lines = "".join(parts).splitlines()
    assert [line.rsplit(",", 1)[1] for line in lines] == [f'"instance":{k % 3}}}' for k in range(7)]


def test_the_instance_column_ends_each_line_of_its_batch():
    rows = np.concatenate(InstanceColumns([5, 6, 7, 1234])(1, 3), axis=1)
    assert [r.tobytes().replace(b"\0", b"") for r in rows] == [
        b',"instance":6', b',"instance":7', b',"instance":1234',
    ]  # fmt: skip


def _same_lines(text: str, plain: str) -> None:
    """The same requests.jsonl lines, their times (``*_ms``) within rounding."""
    lines, plain_lines = text.splitlines(), plain.splitlines()
    assert len(lines) == len(plain_lines)
    for line, plain_line in zip(lines, plain_lines, strict=True):
        got, want = json.loads(line), json.loads(plain_line)
        times = [k for k in want if k.endswith("_ms") and want[k] is not None]
        assert {k: v for k, v in got.items() if k not in times} == {
            k: v for k, v in want.items() if k not in times
        }
        for k in times:
            assert got[k] == pytest.approx(want[k], rel=1e-9, abs=2e-6), (want["rid"], k)


@pytest.mark.parametrize(
    "policy,capacity,cost",
    [
        ("prefill_adder", 1024, CostModel()),
        ("prefill_adder", 40, CostModel()),  # a small pool: growth preempts
        ("conservative", 64, CostModel(fixed_us=700.0)),
        ("prefill_adder", 512, FLAT_1MS),
    ],
)
def test_one_instance_behind_any_router_is_the_plain_run(policy, capacity, cost):
    """The same decisions, counts and lines; the times within rounding (a plain run's
    stretches take in arrivals that find the queue not empty, an instance's end at each
    arrival, where the router looks at it)."""
    import random

    rng = random.Random(7)
    t, reqs = 0.0, []
    for i in range(300):
        t += rng.expovariate(40.0) * 1000.0
        reqs.append((i, t, rng.randrange(1, 400), rng.randrange(1, 120)))

    def fresh():
        return [Req(i, f"r{i}", at * 1000.0, p, m, 0, 0, None) for i, at, p, m in reqs]

    settings = _settings(policy=policy, capacity_blocks=capacity, cost=cost)
    plain_lines: list[str] = []
    stats = RequestStats(SloSpec(ttft_ms=50.0), plain_lines.append)
    plain = Engine(
        settings,
        sink=stats,
        samples=IterationLog(capacity, 16, keep=True, cost=cost),
        arrivals=fresh(),
    )
    res = plain.run()
    stats.close()
    for router in ("round_robin", "power_of_two", "prefix_aware"):
        lines: list[str] = []
        cluster, total = _cluster(1, router, settings, write=lines.append)
        total.slo = SloSpec(ttft_ms=50.0)
        run = cluster.run(fresh())
        total.close()
        _same_lines("".join(lines), "".join(plain_lines))
        got, want = total.summary(), stats.summary()
        assert replace(got, latencies={}) == replace(want, latencies={})
        assert got.latencies == pytest.approx(want.latencies, rel=1e-9)
        (one,) = run.results
        for column, plain_column in zip(one.timeline, res.timeline, strict=True):
            assert column == pytest.approx(plain_column, rel=1e-9, abs=1e-6)
        assert one.end_us == pytest.approx(res.end_us, rel=1e-9)
        assert one.iterations == res.iterations
        ratio = "final_new_token_ratio"
        assert one.counters[ratio] == pytest.approx(res.counters[ratio], rel=1e-12)
        assert {**one.counters, ratio: 0} == {**res.counters, ratio: 0}
    assert res.counters["preemptions"] or capacity != 40  # the small pool did preempt


@pytest.mark.parametrize("instances", [1, 2])
def test_the_driver_holds_only_the_requests_in_flight(instances) -> None:
    # one arrival every 2 ms, each request done in 2 iterations of 1 ms: a few in flight at
    # any time; what the driver holds for the loads (delivered, ended late) stays that few
    cluster, total = _cluster(instances, "round_robin", _settings())
    run = cluster.run(_req(i, 2.0 * i) for i in range(2000))
    total.close()
    assert total.summary().requests == 2000 and len(run.instance_of) == 2000
    held = sum(map(len, cluster.pending)) + sum(len(t.late) for t in cluster.tallies)
    assert held <= 4 * instances
