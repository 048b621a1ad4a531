"""SGLang's loop behind a router (``admit.engine: sglang_loop``, ``admit.cluster.instances >
1``).

One instance behind the driver is the plain run, float for float. With several, each
instance's requests, re-run alone through a plain engine that reads them as its own arrivals,
get the same times: the driver only decides where a request goes, never what an instance does
with it. The loads the ``least_tokens`` router reads from an instance are checked by hand.
"""

from __future__ import annotations

import random

import pytest

from cpkv.serving.cluster.driver import Cluster, InstanceTally
from cpkv.serving.cluster.routers import RouterSettings
from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.sglang_engine import SglangEngine, SglangSettings
from cpkv.serving.engine.simulate import KeepRequests
from cpkv.serving.model.request import Req
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.serving.record.requests import RequestStats
from cpkv.serving.schema import SloSpec
from cpkv.sglang import LoopConfig

UNIT = CostModel(fixed_us=1.0, prefill_token_us=0.0, decode_request_us=0.0, context_token_us=0.0)
SHAPED = CostModel(
    fixed_us=731.3, prefill_token_us=0.917, decode_request_us=13.7, context_token_us=0.0213
)
CONFIG = LoopConfig(
    max_total_num_tokens=1200, max_running_requests=8, context_len=4096, chunked_prefill_size=256
)
NORMAL = LoopConfig(
    max_total_num_tokens=1200, max_running_requests=8, context_len=4096, overlap=False
)


def workload(seed: int, count: int, scale: float) -> list[Req]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(count):
        t += rng.expovariate(1.0 / scale)
        prompt = rng.randrange(1, 300)
        hashes = None
        if rng.random() < 0.5:
            blocks = -(-prompt // 64)
            shared = rng.randrange(blocks + 1)
            hashes = tuple(range(shared)) + tuple(
                1000 * (i + 1) + b for b in range(blocks - shared)
            )
        out.append(Req.new(i, f"q{i}", t + 0.5, prompt, rng.randrange(1, 60), hash_ids=hashes))
    return out


def fresh(reqs: list[Req]) -> list[Req]:
    return [
        Req.new(r.index, r.rid, r.arrival_us, r.prompt_tokens, r.max_new_tokens,
                hash_ids=r.hash_ids)
        for r in reqs
    ]  # fmt: skip


def engine(cost, sink, arrivals=None, config=CONFIG) -> SglangEngine:
    settings = SglangSettings(config, cost, trace_block_tokens=64)
    log = IterationLog(settings.capacity_blocks, 1, keep=True, cost=cost)
    return SglangEngine(settings, sink=sink, samples=log, arrivals=arrivals)


def cluster(n: int, router: str, cost, config=CONFIG) -> tuple[Cluster, list[InstanceTally]]:
    total = RequestStats(SloSpec())
    tallies = [InstanceTally(k, total, RequestStats(SloSpec())) for k in range(n)]
    sims = [engine(cost, tallies[k], config=config) for k in range(n)]
    return Cluster(sims, tallies, router, RouterSettings(), 0, 64), tallies


def plain(reqs: list[Req], cost) -> dict[str, tuple]:
    sink = KeepRequests()
    engine(cost, sink, fresh(reqs)).run()
    return served(sink.requests)


def served(reqs: list[Req]) -> dict[str, tuple]:
    return {r.rid: (r.first_token_us, r.finished_us, r.preemptions, r.l1_hit) for r in reqs}


@pytest.mark.parametrize("cost", [UNIT, SHAPED], ids=["unit", "shaped"])
def test_one_instance_behind_the_driver_is_the_plain_run(cost) -> None:  # (the overlap loop)
    reqs = workload(1, 60, 5.0 if cost is UNIT else 20_000.0)
    run, _ = cluster(1, "round_robin", cost)
    done = fresh(reqs)
    run.run(done)
    assert served(done) == plain(reqs, cost)  # float for float


@pytest.mark.parametrize(
    "router", ["round_robin", "least_requests", "least_tokens", "prefix_aware"]
)
def test_each_instance_serves_its_requests_as_a_plain_run(router: str) -> None:
    reqs = workload(7, 120, 2.0)
    run, tallies = cluster(3, router, UNIT)
    done = fresh(reqs)
    result = run.run(done)
    assert sorted(result.instance_of) != [0] * len(reqs)  # (requests were spread)
    for k in range(3):
        mine = [r for r in reqs if result.instance_of[r.index] == k]
        got = {rid: v for rid, v in served(done).items() if rid in {r.rid for r in mine}}
        assert got == plain(mine, UNIT), (router, k)
    assert sum(t.routed for t in tallies) == len(reqs)


@pytest.mark.parametrize("config", [NORMAL, CONFIG], ids=["normal", "overlap"])
def test_least_tokens_reads_an_instance_by_hand(config) -> None:
    # Unit batches (either loop: a batch's tokens count from its end, processed or not). q0 (t=0.5, prompt 100, 5 tokens) -> instance 0 (a tie: the lowest): its
    # prefill batch [0.5, 1.5) gives its first token, then one decode batch a unit. q1 arrives
    # at 3.2: instance 0 ran the batches that start before 3.2 ([2.5, 3.5) is in flight, its
    # token not out): q0 holds 100 + 2 tokens; instance 1 none -> q1 to instance 1. q2
    # (t=3.3): instance 1 took q1 in at 3.2 (its prefill [3.2, 4.2) in flight): q1 holds its
    # 50 prompt tokens; q0 still 102 -> q2 to instance 1.
    run, _ = cluster(2, "least_tokens", UNIT, config)
    seen = []
    router = run.router

    class Spy:
        def route(self, request, loads, now_ms):
            seen.append([(x.queued_tokens, x.running_tokens) for x in loads])
            return router.route(request, loads, now_ms)

    run.router = Spy()
    reqs = [
        Req.new(0, "q0", 0.5, 100, 5),
        Req.new(1, "q1", 3.2, 50, 3),
        Req.new(2, "q2", 3.3, 10, 1),
    ]
    result = run.run(reqs)
    assert seen[1] == [(0, 102), (0, 0)]
    assert seen[2] == [(0, 102), (0, 50)]
    assert result.instance_of == [0, 1, 1]


def test_a_cluster_run_writes_its_instances(cli) -> None:
    res = cli(
        "admit", "admit.mode=serving", "admit.engine=sglang_loop",
        "admit.workload.source=synthetic", "admit.workload.synthetic.count=40",
        "admit.kv.capacity_blocks=4096", "admit.workload.synthetic.extend_tokens.choices=[300]",
        "admit.workload.synthetic.l1_cached_tokens.choices=[0]",
        "admit.workload.synthetic.l2_cached_tokens.choices=[0]",
        "admit.workload.synthetic.max_new_tokens.choices=[20]",
        "admit.arrivals.process=poisson", "admit.arrivals.rate_rps=50",
        "admit.cluster.instances=2", "admit.cluster.router=least_requests",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    assert len((run / "instances.jsonl").read_text().splitlines()) == 2
    summary = cli.results(run)["summary"]
    assert summary["engine"] == "sglang_loop" and summary["cluster"]["instances"] == 2
    assert sum(x["routed"] for x in summary["cluster"]["per_instance"]) == 40
