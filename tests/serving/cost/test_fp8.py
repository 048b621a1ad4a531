"""FP8 weights and KV (``admit.cost.quantization``, ``admit.cost.kv_cache_dtype``): the bytes
and the GEMM rate the roofline's definition says they change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpkv.core.schema import FieldError
from cpkv.serving.cost.layers.dense import layer_gemms
from cpkv.serving.cost.shapes import MODELS
from cpkv.serving.cost.spec import CostSpec

LLAMA_8B = MODELS.get("llama-3-8b")


def sharp(spec: CostSpec):
    """``spec``'s roofline without kernel latency and with ``max(compute, memory)`` GEMMs."""
    cost = spec.build()
    cal = replace(cost.calibration, gemm_latency_us=0.0, gemm_corner=0.0)
    return type(cost)(cost.shape, cost.gpu, cost.tp, cal, cost.names, cost.gemm_tflops)


def test_a_long_prefill_runs_at_the_fp8_peak() -> None:
    bf16, fp8 = CostSpec(gpu="h100-sxm"), CostSpec(gpu="h100-sxm", quantization="fp8")
    ratio = sharp(fp8).gemm_us(16384) / sharp(bf16).gemm_us(16384)
    assert ratio == pytest.approx(989.4 / 1978.9, rel=1e-9)  # the H100 datasheet's two peaks


def test_a_one_token_decode_reads_half_the_weight_bytes() -> None:
    bf16, fp8 = CostSpec(gpu="h100-sxm"), CostSpec(gpu="h100-sxm", quantization="fp8")
    # memory-bound: weights K*N*param_bytes plus BF16 activations (K+N)*2 per token
    gemms = layer_gemms(LLAMA_8B, 1)
    expected = sum(k * n * 1 + (k + n) * 2 for k, n in gemms) / sum(
        k * n * 2 + (k + n) * 2 for k, n in gemms
    )
    assert sharp(fp8).gemm_us(1) / sharp(bf16).gemm_us(1) == pytest.approx(expected, rel=1e-9)


def test_an_fp8_kv_cache_holds_one_byte_an_element() -> None:
    # Llama-3-8B: 2 (K and V) x 32 layers x 8 KV heads x 128 x bytes
    assert CostSpec().build().kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert CostSpec(kv_cache_dtype="fp8").build().kv_bytes_per_token == 2 * 32 * 8 * 128
    assert CostSpec(kv_cache_dtype="fp8").build().gemm_tflops is None  # weights stay BF16


@pytest.mark.parametrize(
    ("spec", "key", "says"),
    [
        (CostSpec(gpu="a100-80gb", quantization="fp8"), "quantization", "a100-80gb has none"),
        (CostSpec(gpu="a40", quantization="fp8"), "quantization", "allowed: a GPU with them"),
        (CostSpec(quantization="int4"), "quantization", "allowed: null, fp8"),
        (CostSpec(kv_cache_dtype="e5m2"), "kv_cache_dtype", "allowed: auto, fp8"),
        (
            CostSpec(
                quantization="fp8", model_shape=replace(CostSpec().model_shape, param_bytes=2)
            ),
            "model_shape.param_bytes",
            "give one of them",
        ),
        (
            CostSpec(kind="linear", kv_cache_dtype="fp8"),
            "kv_cache_dtype",
            "belongs to kind roofline",
        ),
    ],
)
def test_what_cannot_run_in_fp8_is_named(spec, key, says) -> None:
    with pytest.raises(FieldError) as err:
        spec.validate()
    assert err.value.key == key and says in str(err.value)


def test_a_gpu_spec_can_give_fp8_tensor_cores() -> None:
    spec = CostSpec(gpu="a100-80gb", quantization="fp8")
    spec = replace(spec, gpu_spec=replace(spec.gpu_spec, fp8_tflops=624.0))
    spec.validate()
    assert spec.build().gemm_tflops == 624.0
