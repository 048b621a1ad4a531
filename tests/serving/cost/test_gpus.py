"""The GPUs from datasheets: the roofline scales with each one's peaks as its definition says."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpkv.serving.cost.gpus import GPUS
from cpkv.serving.cost.roofline import RooflineCost
from cpkv.serving.cost.shapes import MODELS

LLAMA_8B = MODELS.get("llama-3-8b")


def plain_roofline(gpu_name: str, like: str) -> RooflineCost:
    """``gpu_name`` with the calibration of ``like``, no kernel latency and a sharp corner
    (``max(compute, memory)``): every GEMM is then the larger of its two roofline terms."""
    gpu = GPUS.get(gpu_name)
    cal = replace(GPUS.get(like).calibration, gemm_latency_us=0.0, gemm_corner=0.0)
    return RooflineCost(LLAMA_8B, gpu, 1, cal)


@pytest.mark.parametrize(
    ("gpu", "like", "hbm"), [("h200", "h100-sxm", 4800.0), ("a100-40gb", "a100-80gb", 1555.0)]
)
def test_one_token_decode_gemms_scale_with_the_memory_bandwidth(gpu, like, hbm) -> None:
    # one token: the weights' read (K*N*2 bytes) dwarfs the 2*tile*K*N FLOPs on both GPUs
    ratio = plain_roofline(gpu, like).gemm_us(1) / plain_roofline(like, like).gemm_us(1)
    assert ratio == pytest.approx(GPUS.get(like).hbm_gb_per_s / hbm, rel=1e-9)


def test_a_long_prefill_scales_with_the_peak_flops() -> None:
    # 16,384 tokens: 2*T*K*N FLOPs dwarf the weight and activation bytes on both GPUs
    ratio = plain_roofline("b200", "h100-sxm").gemm_us(16384) / plain_roofline(
        "h100-sxm", "h100-sxm"
    ).gemm_us(16384)
    assert ratio == pytest.approx(989.4 / 2250.0, rel=1e-9)


def test_the_l40s_all_reduce_runs_over_pcie() -> None:
    # no NVLink: the tensor-parallel all-reduce uses PCIe Gen4's 32 GB/s each way
    l40s, a100 = GPUS.get("l40s"), GPUS.get("a100-80gb")
    assert l40s.nvlink_gb_per_s == l40s.h2d_gb_per_s == 32.0
    assert l40s.calibration == a100.calibration
    comm = 4  # breakdown: (time, gemm, elementwise, attention, communication, ...)
    slow = RooflineCost(LLAMA_8B, l40s, 2).breakdown(4096, 0, 0, 0, 0, 0)[comm]
    fast = RooflineCost(LLAMA_8B, a100, 2).breakdown(4096, 0, 0, 0, 0, 0)[comm]
    fixed = LLAMA_8B.layers * 2 * a100.calibration_for(2).allreduce_latency_us  # two per layer
    # the bandwidth term scales with the link: 300 GB/s of NVLink 3 against 32 of PCIe
    assert (slow - fixed) / (fast - fixed) == pytest.approx(300.0 / 32.0, rel=1e-9)


@pytest.mark.parametrize("name", ["a100-40gb", "a40", "l40s", "h200", "b200"])
def test_each_new_gpu_says_whose_calibration_it_borrows(name) -> None:
    assert "calibration" in GPUS.help(name)
