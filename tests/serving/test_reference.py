"""The optimised serving loop against the loop as it was before issue 18, kept as an
independent reference model (``tests/helpers/serving_reference``, frozen copies of that
code): the same summary row, ``requests.jsonl`` and ``timeline.jsonl``, byte for byte.

Linear cost (``admit.cost.kind: linear``: the reference's only model), the time breakdown
included (the reference's iterations recorded and broken down as a whole).

* the issue's workload (prompt 1024, output 256, Poisson 8 req/s, 16,384 blocks x 16) at
  10,000 requests through the whole runner (run directory, streamed ``requests.jsonl``,
  samples spilled to a temporary file and read back for the timeline), against the
  reference's eager workload, ``with_arrivals`` and loop;
* the three seed-004 policies and two traces with the tiered prefix cache, smaller;
* random small workloads of every policy, option and cost (hypothesis), through
  :func:`~cpkv.serving.loop.simulate`, and again with the linear cost model's inline
  durations switched off (every duration from ``batch_us``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings

from cpkv.core.config import load_config
from cpkv.runs.runner import run_experiment
from cpkv.serving import loop as loop_module
from cpkv.serving.loop import SimulationStalled, simulate
from cpkv.serving.metrics import request_lines, summary_row, timeline
from cpkv.serving.run import settings_from
from cpkv.serving.schema import SloSpec
from tests.helpers import serving_reference as ref
from tests.helpers.paths import MOONCAKE_TRACE, SHARED
from tests.helpers.serving_reference import workload as ref_workload
from tests.helpers.whole_run_breakdown import CostRecorder, bucket_breakdown, time_summary
from tests.serving.test_properties import runs

AZURE = SHARED / "data" / "azure_llm_2023" / "conversation.csv"

ISSUE_WORKLOAD = """\
kind: admit
name: issue-18
seed: 0
admit:
  mode: serving
  workload:
    source: synthetic
    synthetic:
      count: 10000
      l1_cached_tokens: {choices: [0]}
      l2_cached_tokens: {choices: [0]}
      extend_tokens: {choices: [1024]}
      max_new_tokens: {choices: [256]}
  arrivals: {process: poisson, rate_rps: 8}
  iteration: {budget_tokens: 512}
  kv: {block_size: 16, capacity_blocks: 16384}
  slo: {ttft_ms: 100, tpot_ms: 9}
"""


def _both(tmp_path: Path, text: str, overrides: list[str]) -> None:
    """Run the config with the runner and with the reference (linear cost: the reference's
    model), the reference's iterations recorded by :class:`CostRecorder` and broken down by
    :func:`bucket_breakdown` (the whole-run computation the runner streams); compare what
    they wrote."""
    config = tmp_path / "config.yaml"
    config.write_text(text)
    loaded = load_config("admit", str(config), ["admit.cost.kind=linear", *overrides])
    run = run_experiment(loaded, tmp_path / "out", plots=False).path
    cfg = loaded.experiment
    block = cfg.admit
    work = ref_workload.load_serving_workload(block.workload, block.max_new_tokens, cfg.seed)
    requests = ref_workload.with_arrivals(work.requests, block.arrivals, cfg.seed)
    recorder = CostRecorder(block.cost.build())
    points = block.serving.timeline_points
    row, lines, kv_points, res = ref.run_reference(
        requests, settings_from(block, recorder), work.new_cache(), block.slo, points
    )
    parts = bucket_breakdown(res.timeline[0], recorder, res.end_us, points)
    timeline_lines = []
    for line, part in zip(kv_points.splitlines(), parts, strict=True):
        timeline_lines.append(json.dumps({**json.loads(line), **part}, separators=(",", ":")))
    doc = json.loads((run / "results.json").read_text())
    assert doc["rows"][0] == json.loads(json.dumps(dataclasses.asdict(row)))
    assert (run / "requests.jsonl").read_text() == lines
    assert (run / "timeline.jsonl").read_text().splitlines() == timeline_lines
    summary, counters = doc["summary"], res.counters
    assert summary["time"] == json.loads(json.dumps(time_summary(recorder, res.end_us)))
    for key in ("admission_stops", "admissions", "decode_tokens", "l1_hit_tokens"):
        assert summary[key] == counters[key], key
    assert summary["prefill_tokens_computed"] == counters["prefill_tokens"]
    assert summary["l2_loaded_tokens"] == counters["loaded_tokens"]
    recomputed = sum(r.recomputed for r in res.requests)
    assert summary["recompute_bytes"] == recomputed * recorder.kv_bytes_per_token
    if block.policy == "prefill_adder":
        assert summary["final_new_token_ratio"] == counters["final_new_token_ratio"]


def test_the_issue_workload_at_10k_requests_is_byte_identical(tmp_path) -> None:
    _both(tmp_path, ISSUE_WORKLOAD, [])


@pytest.mark.parametrize("policy", ["conservative", "optimistic", "iteration"])
def test_the_seed_004_policies_are_byte_identical(tmp_path, policy) -> None:
    # the token budget of 512 keeps requests waiting: few decode-only stretches
    _both(
        tmp_path, ISSUE_WORKLOAD, [f"admit.policy={policy}", "admit.workload.synthetic.count=1500"]
    )


@pytest.mark.skipif(not MOONCAKE_TRACE.is_file(), reason="the Mooncake trace is not here")
@pytest.mark.parametrize("policy", ["prefill_adder", "optimistic"])
def test_a_trace_with_the_prefix_cache_is_byte_identical(tmp_path, policy) -> None:
    trace = [
        "admit.workload.source=trace",
        f"admit.workload.path={MOONCAKE_TRACE}",
        "admit.workload.limit=500",
        "admit.workload.cache.l1_tokens=200000",
        "admit.workload.cache.l2_tokens=1000000",
        "admit.arrivals.process=trace",
        "admit.arrivals.speedup=0.5",
        "admit.kv.capacity_blocks=20000",
        f"admit.policy={policy}",
    ]
    _both(tmp_path, ISSUE_WORKLOAD, trace)


@pytest.mark.skipif(not AZURE.is_file(), reason="the Azure trace is not here")
def test_the_azure_trace_is_byte_identical(tmp_path) -> None:
    trace = [
        "admit.workload.source=trace",
        "admit.workload.format=azure_csv",
        f"admit.workload.path={AZURE}",
        "admit.workload.limit=2000",
        "admit.arrivals.process=trace",
    ]
    _both(tmp_path, ISSUE_WORKLOAD, trace)


def _compare_simulations(case) -> None:
    s, reqs, cache = case
    from cpkv.trace.prefix_cache import TieredPrefixCache

    def cold():
        return TieredPrefixCache(*cache) if cache else None

    try:
        old = ref.simulate(reqs, s, cold())
    except Exception as err:  # noqa: BLE001 - the reference's own SimulationStalled
        with pytest.raises(SimulationStalled) as caught:
            simulate(reqs, s, cold())
        assert type(err).__name__ == "SimulationStalled" and str(caught.value) == str(err)
        return
    new = simulate(reqs, s, cold())
    assert request_lines(new) == ref.request_lines(old)
    assert new.timeline == old.timeline and new.end_us == old.end_us
    assert new.iterations == old.iterations and new.counters == old.counters
    slo = SloSpec(ttft_ms=3.0, tpot_ms=1.5)
    cap = s.capacity_blocks
    assert dataclasses.asdict(summary_row(new, slo, cap)) == dataclasses.asdict(
        ref.summary_row(old, slo, cap)
    )
    assert timeline(new, cap, 7) == ref.timeline(old, cap, 7)


@settings(max_examples=250, deadline=None)
@given(runs())
def test_random_workloads_give_what_the_reference_gives(case) -> None:
    _compare_simulations(case)


@settings(max_examples=80, deadline=None)
@given(runs())
def test_durations_from_batch_us_alone_give_the_same(case) -> None:
    original = loop_module.linear_costs
    loop_module.linear_costs = lambda cost: None
    try:
        _compare_simulations(case)
    finally:
        loop_module.linear_costs = original
