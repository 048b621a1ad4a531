"""The numbers of the roofline model that no datasheet gives (``admit.cost.calibration``).

Each is *measured* (fitted to Vidur's per-operator GPU timings by ``cpkv fit-cost --profile``)
or *modelled* (an assumption, said so):

* measured, linear layers (GEMMs): ``gemm_flops_eff`` and ``gemm_bw_eff`` (achieved / peak
  FLOP/s and HBM bandwidth), ``gemm_latency_us`` (the fixed time of one GEMM kernel),
  ``gemm_tile_tokens`` (the token dimension is padded to a multiple of it in the compute
  term: tensor-core GEMMs work on whole tiles) and ``gemm_corner`` (how compute and memory
  time combine: ``(C^(1/c) + M^(1/c))^c``; 0 is the textbook roofline ``max(C, M)``, 1 the sum
  ``C + M``, between them the roofline's corner rounded, as measured GEMMs show it);
* measured, the other per-layer kernels (two RMSNorms, rotary embedding, activation, residual
  add): ``elementwise_bw_eff`` and ``elementwise_latency_us``;
* measured, tensor-parallel all-reduce: ``allreduce_bw_eff`` (achieved bus bandwidth / NVLink
  bandwidth) and ``allreduce_latency_us``;
* modelled: ``attention_flops_eff`` (prefill attention's achieved / peak FLOP/s),
  ``attention_bw_eff`` (attention's achieved / peak HBM bandwidth reading the KV cache),
  ``load_bw_eff`` (L2 -> L1 load-back's achieved / peak host-to-device bandwidth) and
  ``overhead_us`` (CPU scheduling, sampling and launch gaps per iteration).

``admit.cost.calibration`` keys are null by default: null takes the GPU's default
(:mod:`cpkv.serving.cost.gpus`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from cpkv.core.schema import non_negative, positive, require

EFFICIENCIES = (
    "gemm_flops_eff", "gemm_bw_eff", "elementwise_bw_eff", "attention_flops_eff",
    "attention_bw_eff", "allreduce_bw_eff", "load_bw_eff",
)  # fmt: skip
LATENCIES = ("gemm_latency_us", "elementwise_latency_us", "allreduce_latency_us", "overhead_us")
MEASURED = (
    "gemm_flops_eff", "gemm_bw_eff", "gemm_latency_us", "gemm_tile_tokens", "gemm_corner",
    "elementwise_bw_eff", "elementwise_latency_us", "allreduce_bw_eff", "allreduce_latency_us",
)  # fmt: skip
"""The calibration keys fitted to GPU measurements; the others are modelled."""


@dataclass(frozen=True)
class Calibration:
    """Every calibration number, resolved (see the module docstring)."""

    gemm_flops_eff: float
    gemm_bw_eff: float
    gemm_latency_us: float
    gemm_tile_tokens: int
    gemm_corner: float
    elementwise_bw_eff: float
    elementwise_latency_us: float
    allreduce_bw_eff: float
    allreduce_latency_us: float
    attention_flops_eff: float
    attention_bw_eff: float
    load_bw_eff: float
    overhead_us: float


@dataclass(frozen=True)
class CalibrationSpec:
    """``admit.cost.calibration``: the GPU's defaults, key by key (null: the default)."""

    gemm_flops_eff: float | None = None
    gemm_bw_eff: float | None = None
    gemm_latency_us: float | None = None
    gemm_tile_tokens: int | None = None
    gemm_corner: float | None = None
    elementwise_bw_eff: float | None = None
    elementwise_latency_us: float | None = None
    allreduce_bw_eff: float | None = None
    allreduce_latency_us: float | None = None
    attention_flops_eff: float | None = None
    attention_bw_eff: float | None = None
    load_bw_eff: float | None = None
    overhead_us: float | None = None

    def validate(self) -> None:
        for key in EFFICIENCIES:
            positive(key, getattr(self, key), allow_none=True)
        for key in LATENCIES:
            non_negative(key, getattr(self, key), allow_none=True)
        positive("gemm_tile_tokens", self.gemm_tile_tokens, allow_none=True)
        c = self.gemm_corner
        require(c is None or 0 <= c <= 1, "gemm_corner", f"must be in [0, 1], got {c}")

    def resolve(self, default: Calibration) -> Calibration:
        """``default`` with the keys set here replaced."""
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        return Calibration(
            **{k: (getattr(default, k) if v is None else v) for k, v in given.items()}
        )
