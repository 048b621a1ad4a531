"""Checks that hold for every engine behind the cluster driver, each taking the engine's own
factory ``make(cost, sink, arrivals=None)``: one instance behind the driver is the plain run,
float for float; with several, each instance's requests re-run alone through a plain engine
get the same times (the driver only decides where a request goes, never what an instance does
with it). The workload mixes shared and own prefixes so that the prefix-aware router has
something to read.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from cpkv.serving.cluster.driver import Cluster, InstanceTally
from cpkv.serving.cluster.routers import RouterSettings
from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.simulate import KeepRequests
from cpkv.serving.model.request import Req
from cpkv.serving.record.requests import RequestStats
from cpkv.serving.schema import SloSpec

UNIT = CostModel(fixed_us=1.0, prefill_token_us=0.0, decode_request_us=0.0, context_token_us=0.0)
SHAPED = CostModel(
    fixed_us=731.3, prefill_token_us=0.917, decode_request_us=13.7, context_token_us=0.0213
)
ROUTERS = ["round_robin", "least_requests", "least_tokens", "prefix_aware"]

MakeEngine = Callable[..., Any]


def workload(seed: int, count: int, scale: float) -> list[Req]:
    """``count`` requests at exponential gaps of mean ``scale`` µs; half share a prefix of
    64-token blocks with each other, the rest have their own blocks."""
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
        out.append(Req(i, f"q{i}", t + 0.5, prompt, rng.randrange(1, 60), hash_ids=hashes))
    return out


def fresh(reqs: list[Req]) -> list[Req]:
    """The same requests, not yet served."""
    return [
        Req(r.index, r.rid, r.arrival_us, r.prompt_tokens, r.max_new_tokens,
                hash_ids=r.hash_ids)
        for r in reqs
    ]  # fmt: skip


def served(reqs: list[Req]) -> dict[str, tuple]:
    return {r.rid: (r.first_token_us, r.finished_us, r.preemptions, r.l1_hit) for r in reqs}


def cluster(make: MakeEngine, n: int, router: str, cost) -> tuple[Cluster, list[InstanceTally]]:
    total = RequestStats(SloSpec())
    tallies = [InstanceTally(k, total, RequestStats(SloSpec())) for k in range(n)]
    sims = [make(cost, tallies[k]) for k in range(n)]
    return Cluster(sims, tallies, router, RouterSettings(), 0, 64), tallies


def plain(make: MakeEngine, reqs: list[Req], cost) -> dict[str, tuple]:
    sink = KeepRequests()
    make(cost, sink, fresh(reqs)).run()
    return served(sink.requests)


def check_one_instance_is_the_plain_run(make: MakeEngine, cost) -> None:
    reqs = workload(1, 60, 5.0 if cost is UNIT else 20_000.0)
    run, _ = cluster(make, 1, "round_robin", cost)
    done = fresh(reqs)
    run.run(done)
    assert served(done) == plain(make, reqs, cost)  # float for float


def check_each_instance_serves_its_requests_as_a_plain_run(make: MakeEngine, router: str) -> None:
    reqs = workload(7, 120, 2.0)
    run, tallies = cluster(make, 3, router, UNIT)
    done = fresh(reqs)
    result = run.run(done)
    assert sorted(result.instance_of) != [0] * len(reqs)  # (requests were spread)
    by_rid = served(done)
    for k in range(3):
        mine = [r for r in reqs if result.instance_of[r.index] == k]
        got = {r.rid: by_rid[r.rid] for r in mine}
        assert got == plain(make, mine, UNIT), (router, k)
    assert sum(t.routed for t in tallies) == len(reqs)


def least_tokens_reads(make: MakeEngine) -> tuple[list[list[tuple[int, int]]], list[int]]:
    """Two instances under ``least_tokens`` at unit cost, three requests (q0 at 0.5: prompt
    100, 5 tokens; q1 at 3.2: 50, 3; q2 at 3.3: 10, 1): the (queued, running) tokens the
    router read from each instance at each arrival, and where each request went."""
    run, _ = cluster(make, 2, "least_tokens", UNIT)
    seen: list[list[tuple[int, int]]] = []
    router = run.router

    class Spy:
        def route(self, request, loads, now_ms):
            seen.append([(x.queued_tokens, x.running_tokens) for x in loads])
            return router.route(request, loads, now_ms)

    run.router = Spy()
    reqs = [
        Req(0, "q0", 0.5, 100, 5),
        Req(1, "q1", 3.2, 50, 3),
        Req(2, "q2", 3.3, 10, 1),
    ]
    result = run.run(reqs)
    return seen, result.instance_of


def check_a_cluster_run_writes_its_instances(cli, engine: str) -> None:
    res = cli(
        "admit", "admit.mode=serving", f"admit.engine={engine}",
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
    assert summary["engine"] == engine and summary["cluster"]["instances"] == 2
    assert sum(x["routed"] for x in summary["cluster"]["per_instance"]) == 40
