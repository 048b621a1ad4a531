"""A deployment's per-GPU times, from the work of its layers (:mod:`.dense`,
:mod:`.attention`, :mod:`.experts`), the GPU's peaks and the calibration: what
:class:`~cpkv.serving.cost.roofline.RooflineCost` adds up into an iteration.

* a GEMM of ``(K, N)`` on ``T`` tokens: ``gemm_latency_us + combine(C, M)``, ``C = 2·Tq·K·N /
  (gemm_flops_eff·P)`` (``Tq``: ``T`` rounded up to ``gemm_tile_tokens``), ``M =
  (K·N·param_bytes + T·(K+N)·2) / (gemm_bw_eff·W)``, ``combine(C, M) = (C^(1/c) +
  M^(1/c))^c`` for ``c = gemm_corner`` (``max(C, M)`` at 0);
* a layer's elementwise kernels: ``5·elementwise_latency_us + T·B / (elementwise_bw_eff·W)``;
* a layer's communication with ``tp > 1``: two all-reduces of ``T·hidden·2`` bytes
  (NCCL's, :func:`~cpkv.serving.cost.allreduce.allreduce_us`, or the engine's custom kernels
  for small messages, :func:`~cpkv.serving.cost.allreduce.engine_allreduce_us`), or, in a layer of experts under expert
  parallelism, one all-reduce (after attention) and the dispatch and combine all-to-alls;
* attention per unit of the iteration's arguments, per layer: FLOPs at
  ``attention_flops_eff·P``, cache reads at ``attention_bw_eff·W``; a decode context token
  costs the larger of its pair's FLOPs and its read; a cached prefix token's up-projection
  (latent attention) is a GEMM's FLOPs at ``gemm_flops_eff``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cpkv.serving.cost.allreduce import allreduce_us, custom_line, engine_allreduce_us, regimes_of
from cpkv.serving.cost.calibration import Calibration
from cpkv.serving.cost.gpus import Gpu
from cpkv.serving.cost.layers.attention import attention_work
from cpkv.serving.cost.layers.dense import (
    ACTIVATION_BYTES,
    attention_gemms,
    elementwise_bytes_per_token,
    mlp_gemms,
)
from cpkv.serving.cost.layers.experts import (
    RoutedExperts,
    alltoall_us,
    moe_side_gemms,
    routed_experts,
)
from cpkv.serving.cost.shapes import ModelShape

ELEMENTWISE_KERNELS = 5  # input RMSNorm, rotary embedding, post-attention RMSNorm, activation, add
ALL_REDUCES_PER_LAYER = 2  # after the attention output projection and after the MLP
GemmUnits = tuple[float, float, float]  # us per padded token, us of weights, us per token


def combine(compute_us: float, memory_us: float, corner: float) -> float:
    """``(C^(1/c) + M^(1/c))^c``: ``max`` at ``c = 0``, the sum at 1 (scaled: no overflow)."""
    if corner == 0.0:
        return compute_us if compute_us > memory_us else memory_us
    if corner == 1.0:
        return compute_us + memory_us
    if corner == 0.5:
        return math.hypot(compute_us, memory_us)
    top = compute_us if compute_us > memory_us else memory_us
    if top <= 0.0:
        return 0.0
    p = 1.0 / corner
    return top * ((compute_us / top) ** p + (memory_us / top) ** p) ** corner


@dataclass(frozen=True)
class LayerKind:
    """The layers of one kind (dense, or with experts): how many, their GEMMs' unit times,
    their routed experts (None for a dense layer), their elementwise time per token, and
    their collectives per layer."""

    count: int
    gemms: tuple[GemmUnits, ...]
    experts: RoutedExperts | None
    elementwise_token_us: float
    all_reduces: int
    all_to_alls: int


class DeploymentTimes:
    """The per-GPU times of ``shape`` on ``tp`` GPUs a stage, ``ep`` of them sharing the
    experts, on ``gpu`` with ``cal`` (module docstring); ``gemm_tflops``: the GEMMs' peak
    when it is not the GPU's BF16 one (FP8)."""

    def __init__(
        self, shape: ModelShape, gpu: Gpu, tp: int, ep: int, cal: Calibration,
        gemm_tflops: float | None = None, allreduce: str = "nccl",
    ) -> None:  # fmt: skip
        self.shape, self.gpu, self.tp, self.ep, self.cal = shape, gpu, tp, ep, cal
        self.custom = custom_line(allreduce, tp, gpu.custom_allreduce)
        flops_us = gpu.peak_tflops * 1e6  # FLOPs per microsecond at peak
        self.bytes_us = gpu.hbm_gb_per_s * 1e3  # bytes per microsecond at peak
        gemm_peak = flops_us if gemm_tflops is None else gemm_tflops * 1e6
        self.gemm_flops_us = cal.gemm_flops_eff * gemm_peak
        self.gemm_bytes_us = cal.gemm_bw_eff * self.bytes_us
        self.kinds = self._kinds()
        self.head = self.units(shape.hidden, -(-shape.vocab // tp))
        self.allreduce = regimes_of(cal)
        self.transfer = regimes_of(gpu.calibration_for(2))  # (a stage-to-stage send)
        self._attention(flops_us)

    def units(self, k: int, n: int) -> GemmUnits:
        """A GEMM's ``(us per padded token of compute, us of weight reads, us per token of
        activations)``."""
        return (
            2.0 * k * n / self.gemm_flops_us,
            k * n * self.shape.param_bytes / self.gemm_bytes_us,
            (k + n) * ACTIVATION_BYTES / self.gemm_bytes_us,
        )

    def _kinds(self) -> tuple[LayerKind, ...]:
        shape, tp, ep, cal = self.shape, self.tp, self.ep, self.cal
        elem_us = cal.elementwise_bw_eff * self.bytes_us
        attn = attention_gemms(shape, tp)
        dense_count = shape.dense_layers if shape.moe else shape.layers
        kinds = []
        if dense_count:
            gemms = attn + mlp_gemms(shape.hidden, shape.mlp, shape.gated_mlp, tp)
            kinds.append(LayerKind(
                dense_count, tuple(self.units(k, n) for k, n in gemms), None,
                elementwise_bytes_per_token(shape, tp) / elem_us, ALL_REDUCES_PER_LAYER, 0,
            ))  # fmt: skip
        if shape.moe:
            experts = routed_experts(shape, tp, ep)
            width = -(-shape.experts_per_token * experts.width // ep)
            width += -(-shape.shared_experts * shape.expert_mlp // tp)
            reduces, a2a = (1, 2) if ep > 1 else (ALL_REDUCES_PER_LAYER, 0)
            kinds.append(LayerKind(
                shape.moe_layers,
                tuple(self.units(k, n) for k, n in attn + moe_side_gemms(shape, tp)),
                experts, elementwise_bytes_per_token(shape, tp, width) / elem_us, reduces, a2a,
            ))  # fmt: skip
        return tuple(kinds)

    def _attention(self, flops_us: float) -> None:
        cal, work = self.cal, attention_work(self.shape, self.tp)
        attn_flops_us = cal.attention_flops_eff * flops_us
        attn_bytes_us = cal.attention_bw_eff * self.bytes_us
        self.pair_us = work.prefill_pair_flops / attn_flops_us
        self.context_us = work.context_token_bytes / attn_bytes_us
        # decode: max(pair_us * c, read_us * c) is max(pair_us, read_us) * c, float for float
        # (rounding is monotone; c >= 0): one attention pair per context token
        self.decode_us = max(work.decode_pair_flops / attn_flops_us, self.context_us)
        self.prefix_us = work.prefix_token_flops / self.gemm_flops_us
        self.index_pair_us = work.index_pair_flops / attn_flops_us
        index_read_us = work.index_token_bytes / attn_bytes_us
        self.index_decode_us = max(self.index_pair_us, index_read_us)
        self.index_context_us = index_read_us
        self.topk = work.topk
        layer_bytes = self.shape.kv_layer_bytes()
        if not self.shape.mla:  # each GPU copies its own KV heads
            layer_bytes = work.context_token_bytes
        load_bytes_us = cal.load_bw_eff * self.gpu.h2d_gb_per_s * 1e3
        self.load_layer_us = layer_bytes / load_bytes_us  # one token, one layer

    # -- times on a number of tokens ------------------------------------------------------
    def gemm_us(self, gemms: tuple[GemmUnits, ...], tokens: int) -> float:
        """``gemms`` on ``tokens`` tokens, each its latency and combined terms."""
        if tokens <= 0:
            return 0.0
        cal = self.cal
        tile, corner, lat = cal.gemm_tile_tokens, cal.gemm_corner, cal.gemm_latency_us
        padded = -(-tokens // tile) * tile
        total = 0.0
        for c, w, a in gemms:
            total += lat + combine(c * padded, w + a * tokens, corner)
        return total

    def experts_us(self, experts: RoutedExperts, tokens: int) -> float:
        """The two grouped GEMMs of ``experts`` on ``tokens`` tokens (:mod:`.experts`)."""
        cal = self.cal
        assigned, padded, touched = experts.load(tokens, cal.gemm_tile_tokens)
        if assigned <= 0.0:
            return 0.0
        total = 0.0
        for k, n in experts.kernels():
            c, w, a = self.units(k, n)
            total += cal.gemm_latency_us + combine(c * padded, w * touched + a * assigned,
                                                   cal.gemm_corner)  # fmt: skip
        return total

    def layers_us(self, tokens: int) -> tuple[float, float, float]:
        """``(gemm, elementwise, communication)`` of every layer on ``tokens`` tokens."""
        cal, shape = self.cal, self.shape
        gemm = elementwise = comm = 0.0
        one_reduce = self.allreduce_us(tokens * shape.hidden * ACTIVATION_BYTES)
        for kind in self.kinds:
            g = self.gemm_us(kind.gemms, tokens)
            if kind.experts is not None:
                g += self.experts_us(kind.experts, tokens)
            e = (
                ELEMENTWISE_KERNELS * cal.elementwise_latency_us
                + kind.elementwise_token_us * tokens
            )
            c = kind.all_reduces * one_reduce
            if kind.all_to_alls:
                c += kind.all_to_alls * alltoall_us(
                    tokens, shape.experts_per_token, shape.hidden, self.ep,
                    self.gpu.nvlink_gb_per_s, cal.allreduce_latency_us, cal.alltoall_bw_eff,
                )  # fmt: skip
            gemm += kind.count * g
            elementwise += kind.count * e
            comm += kind.count * c
        return gemm, elementwise, comm

    def allreduce_us(self, size_bytes: Any) -> float:
        """One tensor-parallel all-reduce (0 on one GPU): the engine's kernels or NCCL's
        (:func:`~cpkv.serving.cost.allreduce.engine_allreduce_us`)."""
        if self.tp <= 1:
            return 0.0
        return engine_allreduce_us(
            size_bytes, self.tp, self.gpu.nvlink_gb_per_s, self.allreduce, self.custom
        )

    def transfer_us(self, tokens: int) -> float:
        """Sending ``tokens`` tokens' activations from one pipeline stage to the next: a
        two-GPU all-reduce of the same bytes (:mod:`.pipeline`)."""
        size = tokens * self.shape.hidden * ACTIVATION_BYTES
        return allreduce_us(size, 2, self.gpu.nvlink_gb_per_s, self.transfer)
