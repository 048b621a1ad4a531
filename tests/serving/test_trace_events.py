"""trace.json (admit.serving.trace_events): Chrome trace-event fields, slices that nest, and
the same results as a run without it."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import asdict

import pytest

from cpkv.serving.cluster.driver import Cluster, InstanceTally
from cpkv.serving.cluster.routers import RouterSettings
from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.engine import Engine
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.model.request import Req
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.serving.record.requests import RequestStats
from cpkv.serving.record.trace.events import TraceEvents
from cpkv.serving.schedulers.adder_pass import AdderBudgets
from cpkv.serving.schema import SloSpec
from tests.helpers.same_run import REL, assert_same_counters, assert_same_timeline

EPS_US = 0.002  # times are written to the nanosecond (3 decimals of a microsecond)


def _requests() -> list[Req]:
    rng = random.Random(3)
    t, out = 0.0, []
    for i in range(120):
        t += rng.expovariate(60.0) * 1e6
        out.append(Req(i, f"r{i}", t, rng.randrange(16, 300), rng.randrange(1, 80), 0, 0, None))
    return out


def _run(trace: bool, instances: int = 2):
    settings = EngineSettings(
        policy="optimistic", block_size=16, capacity_blocks=48, adder=AdderBudgets(16, 16384, 8192),
        cost=CostModel(fixed_us=900.0),
    )  # fmt: skip
    events = TraceEvents() if trace else None
    total = RequestStats(SloSpec())
    tallies, sims = [], []
    for k in range(instances):
        hooks = events.instance(k) if events is not None else None
        tally = InstanceTally(k, total, RequestStats(SloSpec()), on_done=hooks and hooks.request)
        tallies.append(tally)
        samples = IterationLog(48, 16, keep=True, cost=settings.cost)
        sims.append(Engine(settings, sink=tally, samples=samples, trace=hooks))
    cluster = Cluster(sims, tallies, "round_robin", RouterSettings(), 0, 16)
    run = cluster.run(_requests())
    total.close()
    return run, total.summary(), events


def test_trace_events_change_no_result():
    # a traced run takes every iteration in full, the plain one closed-form stretches: the
    # same decisions, the times within rounding (REL)
    run, summary, _ = _run(trace=False)
    traced, traced_summary, _ = _run(trace=True)
    plain, with_trace = asdict(summary), asdict(traced_summary)
    latencies = plain.pop("latencies"), with_trace.pop("latencies")
    wait = plain.pop("longest_wait_ms"), with_trace.pop("longest_wait_ms")
    assert with_trace == plain  # every count
    assert latencies[1] == pytest.approx(latencies[0], rel=REL)
    assert wait[1] == pytest.approx(wait[0], rel=REL)
    assert traced.instance_of == run.instance_of
    for a, b in zip(run.results, traced.results, strict=True):
        assert a.iterations == b.iterations
        assert a.end_us == pytest.approx(b.end_us, rel=REL)
        assert_same_counters(a.counters, b.counters)
        assert_same_timeline(a.timeline, b.timeline)


def test_trace_file_loads_and_its_slices_nest():
    run, summary, events = _run(trace=True)
    doc = json.loads(events.text())
    assert set(doc) == {"traceEvents", "displayTimeUnit"}
    trace = doc["traceEvents"]
    for e in trace:
        assert {"ph", "name", "pid", "tid"} <= set(e), e
        assert e["ph"] in {"M", "X", "C", "i", "b", "e", "n"}
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
    names = {(e["pid"], e["name"]): e["args"] for e in trace if e["ph"] == "M"}
    assert names[(0, "process_name")] == {"name": "instance 0"}
    assert names[(1, "thread_name")] == {"name": "iterations"}

    # one complete slice per iteration, one after the other on each instance's track
    slices = defaultdict(list)
    for e in trace:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and {"prefill_tokens", "decode_tokens", "batch_requests",
                                      "loaded_tokens", "running", "waiting"} <= set(e["args"])  # fmt: skip
            slices[(e["pid"], e["tid"])].append(e)
    assert sorted(slices) == [(0, 0), (1, 0)]
    for (pid, _), xs in slices.items():
        res = run.results[pid]
        assert len(xs) == res.iterations
        for a, b in zip(xs, xs[1:], strict=False):
            assert a["ts"] + a["dur"] <= b["ts"] + EPS_US
        assert sum(x["args"]["prefill_tokens"] for x in xs) == res.counters["prefill_tokens"]
        assert sum(x["args"]["decode_tokens"] for x in xs) == res.counters["decode_tokens"]
        assert abs(xs[-1]["ts"] + xs[-1]["dur"] - res.end_us) <= EPS_US
        preempts = [e for e in trace if e["ph"] == "i" and e["pid"] == pid]
        assert len(preempts) == sum(res.counters["preemptions"].values())
        for p in preempts:  # at the end of an iteration of the track
            assert any(abs(x["ts"] + x["dur"] - p["ts"]) <= EPS_US for x in xs)
    assert any(e["ph"] == "i" for e in trace)  # the small pool did preempt

    # one async slice per request: b(request) b(queued) e(queued) [n(first token)] e(request),
    # each end after its begin, the queued slice inside the request's
    by_id = defaultdict(list)
    for e in trace:
        if e["ph"] in "ben":
            assert e["cat"] == "request"
            by_id[e["id"]].append(e)
    assert sorted(by_id) == list(range(120))
    for index, evs in by_id.items():
        assert {e["pid"] for e in evs} == {run.instance_of[index]}
        stack = []
        last = -1.0
        for e in evs:
            assert e["ts"] >= last - EPS_US
            last = e["ts"]
            if e["ph"] == "b":
                stack.append(e["name"])
            elif e["ph"] == "e":
                assert stack and stack.pop() == e["name"]
            else:
                assert e["name"] == "first token" and len(stack) == 1
        assert stack == []
        assert [e["name"] for e in evs if e["ph"] == "b"] == [f"r{index}", "queued"]
    assert summary.requests == 120
