"""A mixture-of-experts layer's routed experts on one GPU, and expert parallelism's all-to-all.

**Routed experts.** ``T`` tokens each go to ``k`` of ``E`` experts: ``T·k`` token-expert
assignments. With routing spread evenly (the load-balanced routers of these models aim at it),
the experts that receive at least one token number, in expectation,
``touched(T) = E·(1 − (1 − k/E)^T)`` — one token reads ``k`` experts' weights, a large batch
all ``E``. With ``ep`` GPUs of expert parallelism each GPU holds ``E/ep`` whole experts and
receives ``T·k/ep`` assignments; without (``ep`` 1) each GPU holds a ``1/tp`` slice of every
expert (``expert_mlp/tp`` wide) and computes all ``T·k`` assignments on it. Per GPU, the
experts run as two grouped GEMMs (vLLM's and SGLang's fused MoE kernels: gate+up, then down),
each ``gemm_latency_us + combine(C, M)`` as the dense GEMMs are: ``C`` the FLOPs of the
assignments, each expert's rows padded to ``gemm_tile_tokens``; ``M`` the touched experts'
weights and the assignments' activations.

**All-to-all** (``ep`` > 1). Each GPU dispatches its share ``T/ep`` of the tokens to the GPUs
of their ``k`` experts and receives the results back (combine): ``T/ep·k·hidden·2`` bytes
each way, ``(ep − 1)/ep`` of them leaving the GPU, at ``alltoall_bw_eff`` of the link, after
the link's collective latency (``allreduce_latency_us`` of the same GPUs)::

    alltoall_us = allreduce_latency_us + (T/ep)·k·hidden·2·(ep − 1)/ep / (alltoall_bw_eff·L)

``alltoall_bw_eff`` 0.77: DeepEP's intranode dispatch reaches 153 GB/s and its combine
158 GB/s over H800 NVLink (DeepEP README, V1 normal kernels, EP 8), whose datasheet gives
200 GB/s each way (400 GB/s both); DeepEP V2 reaches 726–740 GB/s of B200's 900 (0.81).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cpkv.serving.cost.layers.dense import ACTIVATION_BYTES, mlp_gemms
from cpkv.serving.cost.shapes import ModelShape


def experts_touched(experts: int, top_k: int, tokens: int) -> float:
    """The expected number of experts ``tokens`` tokens route to (module docstring)."""
    if tokens <= 0:
        return 0.0
    return experts * -_expm1_power(1.0 - top_k / experts, tokens)


def _expm1_power(base: float, n: int) -> float:
    """``base**n − 1`` without cancellation when ``base**n`` is near 1."""
    if base <= 0.0:
        return -1.0
    return math.expm1(n * math.log(base))


@dataclass(frozen=True)
class RoutedExperts:
    """The routed experts of one layer on one GPU: ``experts`` in all, ``top_k`` a token,
    ``share`` of the assignments and of the experts on this GPU (``1/ep``), each ``width``
    wide on this GPU, of ``hidden``; ``gated`` (gate and up projections)."""

    experts: int
    top_k: int
    share: float
    hidden: int
    width: int
    gated: bool

    def kernels(self) -> tuple[tuple[int, int], ...]:
        """``(K, N)`` of the two grouped GEMMs of one expert: gate+up, down."""
        up = (2 if self.gated else 1) * self.width
        return ((self.hidden, up), (self.width, self.hidden))

    def load(self, tokens: int, tile: int) -> tuple[float, float, float]:
        """``(assignments, padded assignments, touched experts)`` on this GPU for ``tokens``
        tokens: the rows the kernels compute, padded per expert to ``tile``, and the
        experts whose weights they read."""
        touched = experts_touched(self.experts, self.top_k, tokens)
        assigned = tokens * self.top_k * self.share
        if touched <= 0.0:
            return 0.0, 0.0, 0.0
        rows = tokens * self.top_k / touched  # an expert's rows, on average
        padded = -(-rows // tile) * tile
        return assigned, touched * self.share * padded, touched * self.share


def routed_experts(shape: ModelShape, tp: int, ep: int) -> RoutedExperts:
    """The routed experts of ``shape`` on one GPU of ``tp``, ``ep`` of them holding whole
    experts (1: every GPU a ``1/tp`` slice of each)."""
    width = shape.expert_mlp if ep > 1 else -(-shape.expert_mlp // tp)
    return RoutedExperts(
        shape.experts, shape.experts_per_token, 1.0 / ep, shape.hidden, width, shape.gated_mlp
    )


def moe_side_gemms(shape: ModelShape, tp: int) -> tuple[tuple[int, int], ...]:
    """The other GEMMs of a layer of experts on one GPU: the router ``(hidden, experts)``
    (on every GPU) and the shared experts' MLP (``shared_experts·expert_mlp`` wide, split
    over ``tp``)."""
    gemms: tuple[tuple[int, int], ...] = ((shape.hidden, shape.experts),)
    if shape.shared_experts:
        width = shape.shared_experts * shape.expert_mlp
        gemms += mlp_gemms(shape.hidden, width, shape.gated_mlp, tp)
    return gemms


def alltoall_us(
    tokens: int, top_k: int, hidden: int, ep: int, link_gb_per_s: float, latency_us: float,
    bw_eff: float,
) -> float:  # fmt: skip
    """One dispatch (or combine) of ``tokens`` tokens over ``ep`` GPUs (module docstring)."""
    if ep <= 1 or tokens <= 0:
        return 0.0
    sent = tokens / ep * top_k * hidden * ACTIVATION_BYTES * (ep - 1) / ep
    return latency_us + sent / (bw_eff * link_gb_per_s * 1e3)
