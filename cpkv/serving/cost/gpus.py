"""GPUs for the roofline cost model (``admit.cost.gpu``): a registry by name.

Peak numbers are the vendor datasheets' (dense, i.e. without 2:4 sparsity; bandwidths per
direction):

* A100-80GB SXM — NVIDIA A100 Tensor Core GPU datasheet: BF16 tensor core 312 TFLOP/s
  (624 with sparsity), HBM2e 2,039 GB/s, NVLink 600 GB/s (both directions: 300 each way),
  PCIe Gen4 64 GB/s (both directions: 32 host-to-device);
* H100-SXM (80 GB) — NVIDIA H100 Tensor Core GPU datasheet: BF16 tensor core 989.4 TFLOP/s
  (1,979 with sparsity), HBM3 3.35 TB/s, NVLink 900 GB/s (450 each way), PCIe Gen5 128 GB/s
  (64 host-to-device);
* A100-40GB SXM — the A100 datasheet: BF16 312 TFLOP/s, HBM2 1,555 GB/s, NVLink and PCIe as
  the 80 GB part;
* A40 — NVIDIA A40 datasheet: BF16 tensor core 149.7 TFLOP/s (299.4 with sparsity), GDDR6
  696 GB/s, NVLink bridge 112.5 GB/s (56.25 each way), PCIe Gen4 64 GB/s (32 each way);
* L40S — NVIDIA L40S datasheet: BF16 tensor core 362.05 TFLOP/s (733 with sparsity), GDDR6
  864 GB/s, no NVLink: GPUs talk over PCIe Gen4, 64 GB/s (32 each way, the link used for
  tensor parallelism too);
* H200 SXM (141 GB) — NVIDIA H200 datasheet: BF16 tensor core 989.4 TFLOP/s (1,979 with
  sparsity), HBM3e 4.8 TB/s, NVLink 900 GB/s (450 each way), PCIe Gen5 128 GB/s (64);
* B200 (HGX B200, 180 GB) — NVIDIA HGX B200 datasheet, per GPU: BF16 tensor core 2.25 PFLOP/s
  (4.5 with sparsity), HBM3e 8 TB/s, NVLink 5 1.8 TB/s (900 each way), PCIe Gen5 (64).

FP8 tensor cores (``fp8_tflops``, dense; ``admit.cost.quantization: fp8``): H100 and H200
1,978.9 TFLOP/s (3,958 with sparsity), L40S 733 (1,466), B200 4,500 (9,000); the Ampere GPUs
(A100, A40) have none.

Only the A100-80GB and the H100 have measured profiles (Vidur's); the others borrow the
calibration of the measured GPU nearest in design, said in each one's help: the A100-40GB
and the A40 and L40S the A100's (the same GA100 chip; and for the other two, the nearest
architecture measured), the H200 and the B200 the H100's (the same GH100 chip; the nearest
measured generation). Their times are the datasheet roofline with borrowed efficiencies:
fit a profile of the GPU (``cpkv fit-cost``) before trusting them to a few percent.

``admit.cost.gpu_spec`` overrides any of them, within :data:`PEAK_TFLOPS` and
:data:`BANDWIDTH_GB_PER_S`: from slower than any datacenter GPU of the last decade to ten
times and more the fastest made (a GPU outside them is a typo, and its times would leave
the clock's range). Each GPU carries the default calibration
(:mod:`cpkv.serving.cost.calibration`): its measured keys fitted jointly to every Vidur
profile of that GPU (all models, all TP degrees) by ``cpkv fit-cost --profile
../shared/data/gpu_profiles --table``, which prints these numbers under "GPU defaults". The
all-reduce keys are fitted to the DGX network table of the GPU
(``../shared/data/gpu_profiles/network_<gpu>_dgx/all_reduce.csv``) once per worker count
(``allreduce_by_workers``: 2, 4 and 8 GPUs, the defaults at those TP degrees,
:meth:`Gpu.calibration_for`) and once over all of them (the calibration's, for other TP
degrees); a GPU that borrows a calibration borrows those too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Annotated, Any

from cpkv.core.errors import ConfigError
from cpkv.core.registry import Registry
from cpkv.core.schema import FieldError, Range
from cpkv.serving.cost.allreduce import AllReduceRegimes, with_regimes
from cpkv.serving.cost.calibration import Calibration

PEAK_TFLOPS = Range(
    1, 1e5,
    why="40x the fastest GPU made, B200's 2250 dense BF16",
    low_why="slower than any datacenter GPU of the last decade, a V100 has 125",
)  # fmt: skip
BANDWIDTH_GB_PER_S = {
    "hbm_gb_per_s": Range(
        10, 1e5,
        why="12x the fastest GPU memory made, B200's 8000 GB/s",
        low_why="slower than any GPU memory, a T4 has 320 GB/s",
    ),
    "h2d_gb_per_s": Range(
        0.1, 1e4,
        why="11x the fastest host link made, NVLink-C2C's 900 GB/s",
        low_why="slower than one PCIe 1.0 lane, 0.25 GB/s",
    ),
    "nvlink_gb_per_s": Range(
        1, 1e4,
        why="11x the fastest GPU link made, NVLink 5's 900 GB/s each way",
        low_why="slower than any GPU link, PCIe 1.0 x4 has 1 GB/s",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Gpu:
    """One device: datasheet peaks and its default calibration."""

    peak_tflops: float  # dense BF16 tensor-core FLOP/s, in 1e12
    hbm_gb_per_s: float  # device memory bandwidth, 1e9 bytes/s
    h2d_gb_per_s: float  # host-to-device (PCIe) bandwidth, one direction
    nvlink_gb_per_s: float  # NVLink bandwidth of one GPU, one direction
    calibration: Calibration
    profile_prefix: str = ""  # how Vidur's profile folders name it (a100_..., h100_...)
    fp8_tflops: float | None = None  # dense FP8 tensor-core FLOP/s, in 1e12 (None: no FP8)
    allreduce_by_workers: tuple[tuple[int, AllReduceRegimes], ...] = ()  # measured counts
    custom_allreduce: str = "h100"  # whose table the engines' custom all-reduce takes

    def calibration_for(self, tp: int) -> Calibration:
        """The default calibration at ``tp`` GPUs: the all-reduce keys fitted to that worker
        count's measurements when there are some, else those fitted to all worker counts."""
        for workers, regimes in self.allreduce_by_workers:
            if workers == tp:
                return with_regimes(self.calibration, regimes)
        return self.calibration


@dataclass(frozen=True)
class GpuOverrides:
    """``admit.cost.gpu_spec``: datasheet numbers that replace the named GPU's (null: keep)."""

    peak_tflops: Annotated[float, PEAK_TFLOPS] | None = None
    hbm_gb_per_s: Annotated[float, BANDWIDTH_GB_PER_S["hbm_gb_per_s"]] | None = None
    h2d_gb_per_s: Annotated[float, BANDWIDTH_GB_PER_S["h2d_gb_per_s"]] | None = None
    nvlink_gb_per_s: Annotated[float, BANDWIDTH_GB_PER_S["nvlink_gb_per_s"]] | None = None
    fp8_tflops: Annotated[float, PEAK_TFLOPS] | None = None

    def given(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }


# Modelled (not in the profiles): FlashAttention-2 reaches 50-73 % of A100's peak in its
# forward pass (Dao, 2023, Fig. 5 and sec. 4.1); we take 0.5 for prefill attention, 0.8 of
# HBM bandwidth for reading KV (decode attention is a streaming read), 0.8 of the PCIe
# bandwidth for L2 load-back (pinned-memory copies reach about that). The engine's CPU time
# per iteration is admit.cost.cpu's (cpkv.serving.cost.cpu); overhead_us is GPU idle time
# per iteration beyond it: 0, as SGLang's Nsight profile of consecutive decode batches shows
# no idle GPU time between them (LMSYS SGLang v0.4 blog, zero-overhead batch scheduler).
_MODELLED = {
    "attention_flops_eff": 0.5,
    "attention_bw_eff": 0.8,
    "load_bw_eff": 0.8,
    "overhead_us": 0.0,
    "alltoall_bw_eff": 0.77,  # DeepEP's intranode all-to-all (cpkv.serving.cost.layers.experts)
}

GPUS: Registry[Gpu] = Registry("GPU")
"""GPUs by name (``admit.cost.gpu``)."""

GPUS.register(
    "a100-80gb",
    Gpu(
        312.0,
        2039.0,
        32.0,
        300.0,
        Calibration(
            gemm_flops_eff=0.7197,
            gemm_bw_eff=0.9129,
            gemm_latency_us=5.321,
            gemm_tile_tokens=64,
            gemm_corner=0.67,
            elementwise_bw_eff=0.4918,
            elementwise_latency_us=1.961,
            allreduce_bw_eff=0.5203,
            allreduce_latency_us=15.534,
            allreduce_small_bw_eff=0.0197,
            allreduce_switch_bytes=76800,
            **_MODELLED,
        ),
        profile_prefix="a100",
        custom_allreduce="a100",
        allreduce_by_workers=(
            (2, AllReduceRegimes(3.712, 0.001, 10240, 0.5431)),
            (4, AllReduceRegimes(20.48, 0.293, 4786176, 0.6244)),
            (8, AllReduceRegimes(32.506, 0.3925, 17922048, 0.7668)),
        ),
    ),
    help="NVIDIA A100 80GB SXM: 312 TFLOP/s BF16, 2,039 GB/s HBM2e, PCIe Gen4, NVLink 3",
    aliases=("a100",),
)
GPUS.register(
    "h100-sxm",
    Gpu(
        989.4,
        3350.0,
        64.0,
        450.0,
        Calibration(
            gemm_flops_eff=0.6715,
            gemm_bw_eff=0.9461,
            gemm_latency_us=4.537,
            gemm_tile_tokens=128,
            gemm_corner=0.5,
            elementwise_bw_eff=0.5765,
            elementwise_latency_us=2.054,
            allreduce_bw_eff=0.7343,
            allreduce_latency_us=6.058,
            allreduce_small_bw_eff=0.007,
            allreduce_switch_bytes=39936,
            **_MODELLED,
        ),
        profile_prefix="h100",
        fp8_tflops=1978.9,
        allreduce_by_workers=(
            (2, AllReduceRegimes(7.341, 0.0651, 475136, 0.6725)),
            (4, AllReduceRegimes(35.641, 1.0, 15195136, 0.748)),
            (8, AllReduceRegimes(26.636, 0.6684, 17922048, 0.9525)),
        ),
    ),
    help="NVIDIA H100 SXM5 80GB: 989 TFLOP/s BF16, 3.35 TB/s HBM3, PCIe Gen5, NVLink 4",
    aliases=("h100",),
)


A100 = GPUS.get("a100-80gb")
H100 = GPUS.get("h100-sxm")

GPUS.register(
    "a100-40gb",
    Gpu(
        312.0,
        1555.0,
        32.0,
        300.0,
        A100.calibration,
        allreduce_by_workers=A100.allreduce_by_workers,
        custom_allreduce="a100",
    ),
    help="NVIDIA A100 40GB SXM: 312 TFLOP/s BF16, 1,555 GB/s HBM2; the A100-80GB's calibration",
)
GPUS.register(
    "a40",
    Gpu(
        149.7,
        696.0,
        32.0,
        56.25,
        A100.calibration,
        allreduce_by_workers=A100.allreduce_by_workers,
        custom_allreduce="a100",
    ),
    help="NVIDIA A40 48GB: 149.7 TFLOP/s BF16, 696 GB/s GDDR6, NVLink bridge; the A100's calibration (not measured)",
)
GPUS.register(
    "l40s",
    Gpu(
        362.05,
        864.0,
        32.0,
        32.0,
        A100.calibration,
        fp8_tflops=733.0,
        allreduce_by_workers=A100.allreduce_by_workers,
        custom_allreduce="a100",
    ),
    help="NVIDIA L40S 48GB: 362 TFLOP/s BF16, 864 GB/s GDDR6, PCIe Gen4 only; the A100's calibration (not measured)",
)
GPUS.register(
    "h200",
    Gpu(
        989.4,
        4800.0,
        64.0,
        450.0,
        H100.calibration,
        fp8_tflops=1978.9,
        allreduce_by_workers=H100.allreduce_by_workers,
    ),
    help="NVIDIA H200 SXM 141GB: 989 TFLOP/s BF16, 4.8 TB/s HBM3e, NVLink 4; the H100's calibration",
    aliases=("h200-sxm",),
)
GPUS.register(
    "b200",
    Gpu(
        2250.0,
        8000.0,
        64.0,
        900.0,
        H100.calibration,
        fp8_tflops=4500.0,
        allreduce_by_workers=H100.allreduce_by_workers,
    ),
    help="NVIDIA B200 (HGX) 180GB: 2,250 TFLOP/s BF16, 8 TB/s HBM3e, NVLink 5; the H100's calibration (not measured)",
)


def resolve_gpu(name: str, overrides: GpuOverrides) -> Gpu:
    """The named GPU with ``overrides`` applied; FieldError (key ``gpu``) for an unknown name."""
    try:
        gpu = GPUS.get(name)
    except ConfigError as err:
        raise FieldError("gpu", str(err)) from None
    return replace(gpu, **overrides.given())


def fp8_gpus() -> list[str]:
    """The registered GPUs with FP8 tensor cores."""
    return [name for name in GPUS if GPUS.get(name).fp8_tflops is not None]


def gpu_for_profile(folder_name: str) -> str | None:
    """The registry name of the GPU a Vidur profile folder (``h100_meta-llama_...``) was
    measured on, or None."""
    prefix = folder_name.split("_", 1)[0].lower()
    for name in GPUS:
        if GPUS.get(name).profile_prefix == prefix:
            return name
    return None
