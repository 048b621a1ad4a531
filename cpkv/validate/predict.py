"""A static batch priced by the cost model, and the physical bounds it may not beat.

**The batch** (:func:`predict`): ``B`` prompts of ``I`` tokens prefilled in one iteration
(``B·I`` tokens, ``B·I·(I+1)/2`` causal pairs, ``B·I`` context tokens), then ``O − 1`` decode
iterations of ``B`` requests, the ``j``-th reading ``B·(I + j)`` context tokens (each request's
prompt and the ``j`` tokens it generated). Its decode iterations are the cost model's stretch
(:mod:`cpkv.serving.cost.stretch`): the same numbers as ``batch_us`` iteration by iteration.

**The bounds** (:func:`bounds`), at the datasheet's peaks, with every GPU of the deployment
(``tp·pp``) sharing the work perfectly:

* a prefill computes at least ``2·active weights·B·I`` FLOPs (the linear layers alone) at the
  GEMMs' peak (FP8's with ``quantization: fp8``);
* a decode iteration reads at least every weight a token goes through (the attention
  projections, the dense MLPs, the router and shared experts, ``experts_per_token`` routed
  experts a layer of experts, the LM head) and the context's KV cache, at the HBM's peak.

A prediction below its bound would be a GPU faster than its datasheet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpkv.serving.cost.roofline import active_params
from cpkv.serving.cost.stretch import stretch_durations


@dataclass(frozen=True)
class Prediction:
    """A static batch's times (microseconds) and the metrics of :data:`~.case.METRICS`."""

    prefill_us: float
    decode_us: tuple[float, float, float]  # the first, the last and the sum of its iterations
    metrics: dict[str, float]


def predict(cost: Any, batch: int, prompt: int, output: int, gpus: int) -> Prediction:
    """The static batch of ``batch`` prompts of ``prompt`` tokens generating ``output`` tokens
    each, on ``cost`` (a roofline model of ``gpus`` GPUs)."""
    tokens = batch * prompt
    prefill = cost.batch_us(tokens, 0, 0, tokens, batch * prompt * (prompt + 1) // 2, 0)
    steps = output - 1
    first = last = total = 0.0
    if steps:
        durations = stretch_durations(cost, 0, batch, batch * (prompt + 1), 0, 0, 0, 0)
        first, last, total = (
            durations.duration(0),
            durations.duration(steps - 1),
            durations.total(steps),
        )
    latency = prefill + total
    metrics = {
        "ttft_ms": prefill / 1000.0,
        "latency_ms": latency / 1000.0,
        "output_tokens_per_s": batch * output / (latency / 1e6),
        "output_tokens_per_s_per_gpu": batch * output / (latency / 1e6) / gpus,
    }
    if steps:
        metrics["tpot_ms"] = total / steps / 1000.0
    return Prediction(prefill, (first, last, total), metrics)


def bounds(cost: Any, batch: int, prompt: int, output: int) -> dict[str, float]:
    """The least time (microseconds) physics allows the prefill and the first and last decode
    iterations of the batch on ``cost``'s deployment (module docstring)."""
    shape, gpu = cost.shape, cost.gpu
    gpus = cost.tp * cost.pp
    linear = active_params(shape) - shape.hidden * shape.vocab
    peak_tflops = cost.gemm_tflops or gpu.peak_tflops
    prefill_flops = 2.0 * linear * batch * prompt
    weights = active_params(shape) * shape.param_bytes
    hbm_us = gpu.hbm_gb_per_s * 1e3 * gpus  # bytes per microsecond, every GPU

    def decode(context: int) -> float:
        return (weights + context * shape.kv_bytes_per_token()) / hbm_us

    return {
        "prefill": prefill_flops / (peak_tflops * 1e6 * gpus),
        "first_decode": decode(batch * (prompt + 1)),
        "last_decode": decode(batch * (prompt + output - 1)),
    }
