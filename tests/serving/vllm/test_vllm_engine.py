"""The serving engine under vLLM's scheduler: times and hits derived by hand, the decisions
those of :mod:`cpkv.vllm` step for step, and the config refusals."""

from __future__ import annotations

import pytest

from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.simulate import KeepRequests
from cpkv.serving.engine.vllm_engine import VllmEngine, VllmSettings
from cpkv.serving.model.request import FINISHED, Req
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.vllm import SchedulerConfig
from cpkv.vllm.scenario import run_scenario

COST = CostModel(
    fixed_us=1000.0, prefill_token_us=10.0, decode_request_us=100.0, context_token_us=0.0
)


def run(reqs: list[Req], **knobs) -> list[Req]:
    config = SchedulerConfig(
        **{"num_gpu_blocks": 1000, "max_model_len": 4096, "max_num_batched_tokens": 2048, **knobs}
    )
    settings = VllmSettings(config, COST, trace_block_tokens=64)
    sink = KeepRequests()
    samples = IterationLog(settings.capacity_blocks, settings.block_size, keep=True, cost=COST)
    VllmEngine(settings, sink=sink, samples=samples, arrivals=reqs).run()
    return sink.in_input_order()


def req(index: int, prompt: int, new: int, at_ms: float = 0.0, hashes=None) -> Req:
    return Req(index, f"r{index}", at_ms * 1000, prompt, new, hash_ids=hashes)


def test_one_request_prefills_in_one_step_then_decodes_one_token_a_step() -> None:
    (r,) = run([req(0, 100, 3)])
    prefill = 1000 + 10 * 100  # fixed + 100 prompt tokens
    decode = 1000 + 100  # fixed + one decode row
    assert r.state == FINISHED and r.generated == 3
    assert r.first_token_us == pytest.approx(prefill)
    assert r.finished_us == pytest.approx(prefill + 2 * decode)
    assert r.l1_hit == 0 and r.preemptions == 0


def test_a_long_prompt_is_chunked_by_the_token_budget() -> None:
    (r,) = run([req(0, 5000, 1)], max_model_len=8192)
    # 5000 tokens at 2048 a step: 2048, 2048, 904; the first token at the third step's end
    assert r.first_token_us == pytest.approx(3 * 1000 + 10 * 5000)


def test_a_later_request_hits_the_blocks_of_a_shared_prefix() -> None:
    # trace blocks of 64 tokens: the second request shares the first two (128 tokens)
    first = req(0, 200, 2, hashes=(1, 2, 3, 4))
    second = req(1, 200, 2, at_ms=100.0, hashes=(1, 2, 9, 10))
    a, b = run([first, second])
    assert a.l1_hit == 0 and b.l1_hit == 128
    # the hit is not computed: 72 prompt tokens in the second request's prefill step
    assert b.first_token_us - b.arrival_us == pytest.approx(1000 + 10 * 72)


def test_decisions_are_those_of_the_scheduler_model_step_for_step() -> None:
    # a tiny pool forces preemption; the first-token and finish steps must equal the model's
    specs = [
        {"id": f"r{i}", "arrival": 0, "prompt_len": 40 + 16 * i, "max_tokens": 30} for i in range(6)
    ]
    knobs = {"num_gpu_blocks": 20, "max_num_batched_tokens": 256, "max_num_seqs": 8}
    scenario = run_scenario(
        {"name": "t", "config": {**knobs, "max_model_len": 1024}, "requests": specs}
    )
    unit = CostModel(
        fixed_us=1.0, prefill_token_us=0.0, decode_request_us=0.0, context_token_us=0.0
    )
    config = SchedulerConfig(max_model_len=1024, **knobs)
    sink = KeepRequests()
    settings = VllmSettings(config, unit)
    samples = IterationLog(settings.capacity_blocks, 16, keep=True, cost=unit)
    reqs = [req(i, 40 + 16 * i, 30) for i in range(6)]
    VllmEngine(settings, sink=sink, samples=samples, arrivals=reqs).run()
    preempted = sum(s["num_preemptions"] for s in scenario["requests"].values())
    assert preempted > 0
    for r in sink.in_input_order():
        s = scenario["requests"][r.rid]
        # each step takes 1 us: a token emitted at step k's end is stamped k + 1
        assert r.finished_us == pytest.approx(s["finish_step"] + 1)
        assert r.preemptions == s["num_preemptions"] and r.generated == s["output_tokens"]


def test_a_prompt_reaching_max_model_len_is_rejected() -> None:
    big, small = run([req(0, 4096, 2), req(1, 10, 2)])
    assert big.reject_reason == "exceeds_max_model_len" and small.state == FINISHED


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("admit.policy=iteration", "admit.policy: 'iteration' is SGLang's"),
        ("admit.page_size=64", "admit.page_size: 64 is a budget of SGLang's PrefillAdder"),
        ("admit.kv.victim=newest_first", "admit.kv.victim: a block policy's option"),
        ("admit.serving.on_preempt=abort", "admit.serving: admit.serving's options are"),
        ("admit.backend=sglang", "admit.backend: 'sglang' runs SGLang's scheduler"),
        ("admit.engine=tgi", "admit.engine"),
        (
            "admit.vllm.max_num_seqs=4096 admit.vllm.max_num_batched_tokens=2048",
            "admit.vllm.max_num_batched_tokens: must be >= max_num_seqs",
        ),
        ("admit.vllm.num_gpu_blocks=3 admit.vllm.max_model_len=1024", "vLLM refuses to start so"),
    ],
)
def test_bad_vllm_config_is_one_line(cli, override, message) -> None:
    res = cli(
        "admit", "admit.mode=serving", "admit.engine=vllm",
        "admit.workload.source=synthetic", "admit.workload.synthetic.count=4",
        "admit.workload.synthetic.l1_cached_tokens.choices=[0]",
        "admit.workload.synthetic.l2_cached_tokens.choices=[0]", *override.split(),
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1
