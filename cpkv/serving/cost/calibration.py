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
* measured, tensor-parallel all-reduce (:mod:`cpkv.serving.cost.allreduce`):
  ``allreduce_latency_us`` (the fixed time of one all-reduce), ``allreduce_small_bw_eff``
  (achieved bus bandwidth / NVLink bandwidth of the low-latency regime, for the bytes up to
  ``allreduce_switch_bytes``) and ``allreduce_bw_eff`` (the same for the bytes above it; with
  ``allreduce_switch_bytes: 0``, one latency and one bandwidth); a GPU's defaults hold them
  per measured worker count (:meth:`~cpkv.serving.cost.gpus.Gpu.calibration_for`);
* modelled: ``attention_flops_eff`` (prefill attention's achieved / peak FLOP/s),
  ``attention_bw_eff`` (attention's achieved / peak HBM bandwidth reading the KV cache),
  ``load_bw_eff`` (L2 -> L1 load-back's achieved / peak host-to-device bandwidth),
  ``overhead_us`` (GPU idle time per iteration beyond the engine's CPU work,
  :mod:`cpkv.serving.cost.cpu`) and ``alltoall_bw_eff`` (expert parallelism's dispatch and
  combine: achieved / NVLink bandwidth, :mod:`cpkv.serving.cost.layers.experts`).

``admit.cost.calibration`` keys are null by default: null takes the GPU's default
(:mod:`cpkv.serving.cost.gpus`). Efficiencies are in [:data:`MIN_EFFICIENCY`, 1] (achieved
over peak: never above the datasheet), latencies in [0, :data:`MAX_LATENCY_US`], the tile in [1,
:data:`MAX_TILE_TOKENS`], the corner in [0, 1], the all-reduce's switch in [0,
:data:`MAX_SWITCH_BYTES`] bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated

from cpkv.core.schema import Range

MAX_LATENCY_US = 1e6
MAX_TILE_TOKENS = 4096
MIN_EFFICIENCY = 1e-3
Efficiency = Annotated[
    float,
    Range(
        MIN_EFFICIENCY, 1, why="achieved / peak: no kernel beats the datasheet",
        low_why="0.1% of the peak: a GPU that slow computes no faster than a CPU core",
    ),
]  # fmt: skip
LatencyUs = Annotated[
    float, Range(0, MAX_LATENCY_US, why="1 s: a million times a kernel launch's microseconds")
]
TileTokens = Annotated[
    int, Range(1, MAX_TILE_TOKENS, why="16x the largest tensor-core tile of any GEMM, 256")
]
Corner = Annotated[float, Range(0, 1, why="0: max(C, M), 1: C + M")]
MAX_SWITCH_BYTES = 2**40
SwitchBytes = Annotated[
    int, Range(0, MAX_SWITCH_BYTES, why="1 TiB: 16,000x the largest all-reduce measured, 64 MiB")
]

MEASURED = (
    "gemm_flops_eff", "gemm_bw_eff", "gemm_latency_us", "gemm_tile_tokens", "gemm_corner",
    "elementwise_bw_eff", "elementwise_latency_us", "allreduce_bw_eff", "allreduce_latency_us",
    "allreduce_small_bw_eff", "allreduce_switch_bytes",
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
    allreduce_small_bw_eff: float
    allreduce_switch_bytes: int
    attention_flops_eff: float
    attention_bw_eff: float
    load_bw_eff: float
    overhead_us: float
    alltoall_bw_eff: float = 0.77


@dataclass(frozen=True)
class CalibrationSpec:
    """``admit.cost.calibration``: the GPU's defaults, key by key (null: the default)."""

    gemm_flops_eff: Efficiency | None = None
    gemm_bw_eff: Efficiency | None = None
    gemm_latency_us: LatencyUs | None = None
    gemm_tile_tokens: TileTokens | None = None
    gemm_corner: Corner | None = None
    elementwise_bw_eff: Efficiency | None = None
    elementwise_latency_us: LatencyUs | None = None
    allreduce_bw_eff: Efficiency | None = None
    allreduce_latency_us: LatencyUs | None = None
    allreduce_small_bw_eff: Efficiency | None = None
    allreduce_switch_bytes: SwitchBytes | None = None
    attention_flops_eff: Efficiency | None = None
    attention_bw_eff: Efficiency | None = None
    load_bw_eff: Efficiency | None = None
    overhead_us: LatencyUs | None = None
    alltoall_bw_eff: Efficiency | None = None

    def resolve(self, default: Calibration) -> Calibration:
        """``default`` with the keys set here replaced."""
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        return Calibration(
            **{k: (getattr(default, k) if v is None else v) for k, v in given.items()}
        )


def calibration_problem(cal: Calibration) -> tuple[str, str] | None:
    """``(key, why)`` for the first number of ``cal`` outside the bounds of its
    ``admit.cost.calibration`` key (a fit that went astray), or None."""
    from cpkv.core.schema.keys import leaves

    for leaf in leaves(CalibrationSpec):
        value = getattr(cal, leaf.key)
        for bound in leaf.ranges:
            problem = bound.problem(value)
            if problem is not None:
                return leaf.key, f"{problem}, got {value:.6g}"
    return None
