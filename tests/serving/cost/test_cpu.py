"""The engine's CPU work per iteration (:mod:`cpkv.serving.cost.cpu`): by hand on the tiny
model of ``test_roofline_hand`` with and without overlap, the engines' defaults, the
``admit.cost.cpu`` block's refusals, and the stretch of a CPU-bound model."""

from __future__ import annotations

import math

import pytest

from cpkv.core.errors import ConfigError
from cpkv.serving.cost.cpu import ENGINE_CPU, CpuSpec, EngineCpu
from cpkv.serving.cost.roofline import RooflineCost
from cpkv.serving.cost.spec import CostSpec
from tests.serving.cost.test_roofline_hand import CHIP, TINY

# The decode iteration of test_one_decode_iteration_by_hand: 3 requests, 60 context tokens;
# gemm 12.84256 us, elementwise 5.24576 us, attention 0.3072 us, overhead_us 10
GEMM, ELEMENTWISE, ATTENTION, FIXED = 12.84256, 5.24576, 0.3072, 10.0
COVER = GEMM + ELEMENTWISE  # no all-reduce on one GPU: 18.08832 us


def decode(cpu: EngineCpu) -> tuple[float, ...]:
    return RooflineCost(TINY, CHIP, cpu=cpu).breakdown(0, 3, 60, 0, 0, 0)


def test_without_overlap_the_gpu_waits_for_all_the_cpu_work() -> None:
    # 100 us + 10 us x 3 sampled sequences + 0.5 us x 3 tokens = 131.5 us, all waited for
    parts = decode(EngineCpu(100.0, 10.0, 0.5, overlap=False))
    assert parts[6] == pytest.approx(FIXED + 131.5, rel=1e-12)
    assert parts[0] == pytest.approx(GEMM + ELEMENTWISE + ATTENTION + FIXED + 131.5, rel=1e-12)


def test_with_overlap_only_the_cpu_work_beyond_the_cover_shows() -> None:
    # 131.5 us of CPU work against 18.08832 us of GEMMs and elementwise kernels: 113.41168
    # waited, so the iteration is max(cover, cpu) + attention + overhead_us
    parts = decode(EngineCpu(100.0, 10.0, 0.5, overlap=True))
    assert parts[6] == pytest.approx(FIXED + 113.41168, rel=1e-12)
    assert parts[0] == pytest.approx(131.5 + ATTENTION + FIXED, rel=1e-12)
    # 5 + 1 x 3 + 0 = 8 us of CPU work hides behind the 18 us cover entirely
    hidden = decode(EngineCpu(5.0, 1.0, 0.0, overlap=True))
    assert hidden[6] == FIXED
    assert hidden[0] == pytest.approx(GEMM + ELEMENTWISE + ATTENTION + FIXED, rel=1e-12)


def test_a_prefill_counts_one_sampled_sequence_and_all_its_tokens() -> None:
    # 20 prefill tokens + 2 decodes: 22 tokens, 3 sampled sequences; no overlap
    cpu = EngineCpu(7.0, 2.0, 0.25, overlap=False)
    parts = RooflineCost(TINY, CHIP, cpu=cpu).breakdown(20, 2, 40, 32, 450, 0)
    assert parts[6] == pytest.approx(FIXED + 7.0 + 2.0 * 3 + 0.25 * 22, rel=1e-12)


def test_an_iteration_without_tokens_still_pays_the_fixed_cpu_work() -> None:
    # only a load-back: 12 tokens x 2 layers x 128 B at 500 B/us = 6.144 us, nothing to hide
    parts = RooflineCost(TINY, CHIP, cpu=EngineCpu(40.0, 9.0, 9.0, True)).breakdown(
        0, 0, 0, 0, 0, 12
    )
    assert parts[6] == FIXED + 40.0
    assert parts[0] == pytest.approx(6.144 + FIXED + 40.0, rel=1e-12)


def test_the_engines_defaults() -> None:
    # SGLang: 2.94 ms TPOT against a 2.632 ms forward (0.308 ms); vLLM: 5.5 ms between two
    # steps of 256 requests -> (5500 - 310) / 256 = 20.3 us a request
    assert ENGINE_CPU["sglang"].iteration_us == pytest.approx(2940 - 2632, abs=5)
    assert ENGINE_CPU["vllm"].request_us == pytest.approx((5500 - 310) / 256, abs=1)
    assert ENGINE_CPU["sglang"].overlap and ENGINE_CPU["vllm"].overlap
    assert ENGINE_CPU["none"].work_us(8192, 256) == 0.0
    # 256 decoding requests: 310 + 20 x 256 = 5,430 us of CPU work
    assert ENGINE_CPU["sglang"].work_us(256, 256) == 5430.0


def test_cpu_engine_null_follows_admit_engine_and_vllm_pipelines_do_not_overlap() -> None:
    assert CostSpec().build().cpu == ENGINE_CPU["sglang"]
    assert CostSpec().build("vllm").cpu == ENGINE_CPU["vllm"]
    assert CostSpec(cpu=CpuSpec(engine="none")).build("vllm").cpu == ENGINE_CPU["none"]
    assert CostSpec().build("cpkv").cpu == ENGINE_CPU["sglang"]  # cpkv's loop models SGLang
    assert not CpuSpec().resolve("vllm", pipeline_stages=2).overlap
    assert CpuSpec().resolve("sglang", pipeline_stages=2).overlap
    mine = CpuSpec(engine="vllm", overlap=False, request_us=3.0).resolve()
    assert mine == EngineCpu(310.0, 3.0, 0.0, False)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("admit.cost.cpu.engine=trt", "admit.cost.cpu.engine: unknown value 'trt'"),
        ("admit.cost.cpu.request_us=-1", "admit.cost.cpu.request_us: must be >= 0"),
        ("admit.cost.cpu.overlap=maybe", "admit.cost.cpu.overlap"),
        ("admit.cost.cpu.colour=1", "admit.cost.cpu.colour: unknown key"),
    ],
)
def test_bad_cpu_keys_are_refused_in_one_line(cli, override, says) -> None:
    res = cli("admit", "admit.mode=serving", override)
    assert res.exit_code == 2, res.output
    assert says in res.output
    assert "Traceback" not in res.output


def test_cpu_keys_under_the_linear_kind_and_overlap_without_an_engine_are_refused() -> None:
    from cpkv.core.config import load_config

    with pytest.raises(ConfigError, match="admit.cost.cpu: belongs to kind roofline"):
        load_config("admit", None, ["admit.cost.kind=linear", "admit.cost.cpu.request_us=5"])
    with pytest.raises(ConfigError, match="admit.cost.cpu.overlap: engine none has no CPU"):
        load_config("admit", None, ["admit.cost.cpu.engine=none", "admit.cost.cpu.overlap=true"])


def test_a_cpu_bound_stretch_is_its_iterations() -> None:
    """A decode stretch whose CPU work exceeds the GPU's cover: the overhead is constant over
    the stretch (the batch's token count is), so the stretch stays one affine piece."""
    cpu = EngineCpu(3000.0, 50.0, 0.0, overlap=True)
    model = RooflineCost(TINY, CHIP, cpu=cpu)
    d = model.stretch(0, 16, 16 * 500, 0, 0, 0, 0)
    assert len(d.pieces) == 1
    want = [model.batch_us(0, 16, 16 * 500 + 16 * j, 0, 0, 0) for j in range(2000)]
    assert max(abs(d.duration(j) - w) / w for j, w in enumerate(want)) <= 1e-12
    assert d.total(2000) == pytest.approx(math.fsum(want), rel=1e-12)
    assert model.breakdown(0, 16, 8000, 0, 0, 0)[6] > 3000.0  # CPU-bound: mostly overhead
