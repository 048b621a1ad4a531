"""The cost models inside the serving loop: the quadratic prefill attention as a TTFT, the
linear kind giving today's results float for float (against the formula written out here,
independently of cpkv), decode stretches under the roofline model, the recorder's breakdown."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cpkv.serving.cost.model import CostModel
from cpkv.serving.cost.spec import CostSpec
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.engine.simulate import simulate
from cpkv.serving.input.workload import ServingRequest, load_serving_workload
from cpkv.serving.record.metrics import request_lines, summary_row, timeline
from cpkv.serving.schedulers.adder_pass import AdderBudgets
from cpkv.serving.schema import SloSpec
from tests.helpers.paths import MOONCAKE_TRACE
from tests.helpers.whole_run_breakdown import CostRecorder, time_summary

ROOF = CostSpec(model="llama-3-8b", gpu="h100-sxm").build()
WIDE = EngineSettings(
    block_size=16,
    capacity_blocks=10_000,
    adder=AdderBudgets(16, 100_000, None),
    cost=ROOF,
)
needs_trace = pytest.mark.skipif(
    not MOONCAKE_TRACE.exists(), reason="../shared/data is not present"
)


def test_same_prompt_tokens_longer_prefix_later_first_token() -> None:
    """1024 prompt tokens computed either way; B's come after 3072 tokens cached in L1."""
    a = simulate([ServingRequest("a", 0.0, 1024, 1)], WIDE).requests[0]
    b = simulate([ServingRequest("b", 0.0, 4096, 1, l1_cached_tokens=3072)], WIDE).requests[0]
    assert a.prefilled == b.prefilled == 1024
    # one iteration each: its time is the TTFT; the loop passes the pairs of the formula
    # e*p + e*(e+1)/2: 524,800 for p = 0, 3,670,528 for p = 3072
    ttft_a = ROOF.batch_us(1024, 0, 0, 1024, 524_800, 0)
    ttft_b = ROOF.batch_us(1024, 0, 0, 4096, 3_670_528, 0)
    assert a.first_token_us == ttft_a and b.first_token_us == ttft_b
    attention_a = ROOF.breakdown(1024, 0, 0, 1024, 524_800, 0)[3]
    attention_b = ROOF.breakdown(1024, 0, 0, 4096, 3_670_528, 0)[3]
    assert ttft_b - ttft_a == pytest.approx(attention_b - attention_a, rel=1e-12)
    assert attention_b / attention_a == pytest.approx(3_670_528 / 524_800, rel=1e-12)


class TodaysFormula:
    """The iteration time before roofline existed, written out here (not imported):
    fixed + a*prefill + b*decode + c*(decode context + prefill context) + d*loaded, summed
    left to right, and ignoring the attention pairs. Its breakdown (which the iteration log
    reads back) names the terms as the linear kind documents them: a*prefill + b*decode the
    GEMMs, c*context attention, d*loaded the load, fixed the overhead; no FLOPs."""

    peak_flops_per_us = None

    def __init__(self, fixed, a, b, c, kv_bytes, gbps) -> None:
        self.kv_bytes_per_token = kv_bytes
        self.terms = (fixed, a, b, c, 0.0 if gbps is None else kv_bytes / (gbps * 1e3))

    def batch_us(self, prefill, decode, decode_ctx, prefill_ctx, pairs, loaded) -> float:
        fixed, a, b, c, d = self.terms
        return fixed + a * prefill + b * decode + c * (decode_ctx + prefill_ctx) + d * loaded

    def breakdown(self, prefill, decode, decode_ctx, prefill_ctx, pairs, loaded) -> tuple:
        fixed, a, b, c, d = self.terms
        time = self.batch_us(prefill, decode, decode_ctx, prefill_ctx, pairs, loaded)
        gemm, attention = a * prefill + b * decode, c * (decode_ctx + prefill_ctx)
        return (time, gemm, 0.0, attention, 0.0, d * loaded, fixed, 0.0)


@needs_trace
@pytest.mark.parametrize("policy", ["prefill_adder", "optimistic"])
def test_kind_linear_gives_todays_results_float_for_float(policy) -> None:
    from cpkv.core.config import load_config
    from cpkv.serving.engine.settings import settings_from

    overrides = [
        f"admit.policy={policy}", "admit.workload.limit=300", "admit.cost.kind=linear",
        "admit.cost.fixed_us=4000", "admit.cost.prefill_token_us=25", "admit.cost.decode_request_us=28",
        "admit.cost.context_token_us=0.047", "admit.cost.l2_load_gb_per_s=51.6",
    ]  # fmt: skip
    cfg = load_config("admit", "configs/serving.yaml", overrides).experiment
    block = cfg.admit
    work = load_serving_workload(block.workload, block.max_new_tokens, cfg.seed)
    model = block.cost.build()
    assert isinstance(model, CostModel)
    recorder = CostRecorder(model)
    ours = simulate(work.requests, settings_from(block, recorder), work.new_cache())
    theirs = simulate(
        work.requests,
        settings_from(block, TodaysFormula(4000.0, 25.0, 28.0, 0.047, 131072, 51.6)),
        work.new_cache(),
    )
    assert ours.iterations > 1000
    assert request_lines(ours) == request_lines(theirs)
    assert summary_row(ours, SloSpec(), 32768) == summary_row(theirs, SloSpec(), 32768)
    assert timeline(ours, 32768, 50) == timeline(theirs, 32768, 50)
    assert ours.timeline == theirs.timeline
    # the recorder saw every iteration; the linear parts sum to the busy time
    time = time_summary(recorder, ours.end_us)
    assert recorder.iterations == ours.iterations
    parts = sum(
        time[f"{p}_s"]
        for p in ("gemm", "elementwise", "attention", "communication", "load", "overhead")
    )
    assert parts == pytest.approx(time["busy_s"], rel=1e-9)
    assert time["mfu_pct"] is None


@needs_trace
@pytest.mark.parametrize("policy", ["prefill_adder", "conservative"])
def test_decode_stretches_change_nothing_under_roofline(policy) -> None:
    from cpkv.trace.prefix_cache import CacheConfig
    from cpkv.workload.sources import WorkloadSpec

    spec = WorkloadSpec(
        source="trace", path=str(MOONCAKE_TRACE), limit=150,
        cache=CacheConfig(l1_tokens=1 << 20, l2_tokens=1 << 23),
    )  # fmt: skip
    work = load_serving_workload(spec, 128)
    s = replace(
        WIDE, policy=policy, capacity_blocks=20_000, cost=CostSpec(gpu="a100-80gb", tp=2).build()
    )
    with_stretches = simulate(work.requests, s, work.new_cache())
    assert with_stretches.iterations > 500
    step_by_step = simulate(work.requests, s, work.new_cache(), stretches=False)
    assert request_lines(with_stretches) == request_lines(step_by_step)
    # the blocks and requests of every iteration exactly; its start and duration up to the
    # rounding of the stretches' closed-form sums
    t0, dt, *counts = with_stretches.timeline
    want_t0, want_dt, *want_counts = step_by_step.timeline
    assert counts == want_counts
    assert t0 == pytest.approx(want_t0, rel=1e-9) and dt == pytest.approx(want_dt, rel=1e-9)


def test_serving_run_reports_the_breakdown_per_bucket_and_summed(cli, tmp_path) -> None:
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text(
        "".join(
            json.dumps({"rid": f"r{i}", "l1_cached_tokens": 0, "l2_cached_tokens": 0,
                        "extend_tokens": 500 + 100 * i, "max_new_tokens": 20, "arrival_ms": 10.0 * i}) + "\n"
            for i in range(8)
        )
    )  # fmt: skip
    res = cli(
        "admit", "admit.mode=serving", "admit.workload.source=jsonl", f"admit.workload.path={reqs}",
        "admit.cost.model=llama-2-70b", "admit.cost.tp=4", "admit.serving.timeline_points=7",
        "admit.kv.block_size=16", "admit.kv.capacity_blocks=4000", "admit.cp.enabled=false",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    doc = cli.results(run)
    time = doc["summary"]["time"]
    assert "time breakdown: GPU busy" in res.output and "MFU" in res.output
    lines = [json.loads(x) for x in (run / "timeline.jsonl").read_text().splitlines()]
    assert len(lines) == 7 and doc["rows"][0]["finished"] == 8
    for part in ("gemm", "elementwise", "attention", "communication", "load", "overhead"):
        # the buckets split the run's time: their sum is the summed part
        assert sum(x[f"{part}_ms"] for x in lines) / 1000 == pytest.approx(
            time[f"{part}_s"], abs=1e-6
        )
    assert time["communication_s"] > 0  # TP 4: all-reduce
    assert sum(x["busy_pct"] for x in lines) / 7 == pytest.approx(time["busy_pct"], rel=1e-4)
    assert sum(x["mfu_pct"] for x in lines) / 7 == pytest.approx(time["mfu_pct"], rel=1e-4)
    # MFU = model FLOPs / (makespan x 4 GPUs x 989.4 TFLOP/s)
    makespan = doc["rows"][0]["makespan_s"]
    assert time["mfu_pct"] == pytest.approx(
        100 * time["model_tflop"] * 1e12 / (makespan * 4 * 989.4e12), rel=1e-4
    )
    assert 0 < time["mfu_busy_pct"] < 100 and time["busy_pct"] <= 100


AZURE = MOONCAKE_TRACE.parent / "azure_llm_2023"


@pytest.mark.skipif(not AZURE.exists(), reason="../shared/data/azure_llm_2023 is not present")
@pytest.mark.parametrize(
    "config",
    ["serving_azure_conv_llama3_8b_a100.yaml", "serving_azure_code_llama2_70b_h100x4.yaml"],
)
def test_shipped_azure_configs_run_and_report_time_and_mfu(cli, config) -> None:
    from tests.helpers.paths import CONFIGS

    res = cli("admit", str(CONFIGS / "admit" / config), "admit.workload.limit=400")
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    doc = cli.results(run)
    time = doc["summary"]["time"]
    assert doc["rows"][0]["finished"] == 400
    assert 0 < time["mfu_pct"] <= time["mfu_busy_pct"] < 100
    assert time["gemm_s"] > time["overhead_s"] >= 0  # (the CPU hides behind the GPU here)
    assert "time breakdown: GPU busy" in res.output
