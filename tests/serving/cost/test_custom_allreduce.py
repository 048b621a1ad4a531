"""The engines' custom all-reduce (:mod:`cpkv.serving.cost.allreduce`): its shipped lines are
the relative least-squares fits of the published table (refitted here), within the stated
errors; a message above the largest size measured goes to NCCL; ``admit.cost.allreduce``
follows the CPU's engine."""

from __future__ import annotations

import numpy as np
import pytest

from cpkv.serving.cost.allreduce import (
    CUSTOM_ALLREDUCE,
    CUSTOM_LATENCIES_US,
    CUSTOM_MAX_BYTES,
    CUSTOM_SIZES,
    custom_line,
    engine_allreduce_us,
    regimes_of,
)
from cpkv.serving.cost.cpu import CpuSpec
from cpkv.serving.cost.gpus import GPUS
from cpkv.serving.cost.spec import CostSpec

H100_LINK_US = 450e3  # bytes per microsecond, one way


def refit(times: tuple[float, ...], workers: int) -> tuple[float, float, float, float]:
    """``latency + x / eff`` against the times, minimising the squared relative errors
    (``x`` the ring's bytes at the link's full speed): linear in the latency and ``1/eff``."""
    t = np.asarray(times)
    x = 2 * (workers - 1) / workers * np.asarray(CUSTOM_SIZES, float) / H100_LINK_US
    a = np.stack([1 / t, x / t], axis=1)
    (latency, inv), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    rel = np.abs((latency + x * inv) / t - 1)
    return latency, 1 / inv, float(np.median(rel)), float(rel.max())


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("workers", [2, 4, 8])
def test_the_shipped_lines_are_the_fits_of_the_published_table(kind, workers) -> None:
    latency, eff, median, worst = refit(CUSTOM_LATENCIES_US[kind][workers], workers)
    assert CUSTOM_ALLREDUCE[kind][workers] == pytest.approx((latency, eff), abs=0.006)
    assert median <= 0.12 and worst <= 0.175  # (docs/cost-model.md states each table's)


def test_a_decode_all_reduce_takes_the_custom_line_and_a_large_one_nccl() -> None:
    h100 = GPUS.get("h100-sxm")
    regimes = regimes_of(h100.calibration_for(8))
    line = custom_line("sglang", 8)
    # 64 tokens x 8192 x 2 B = 1 MiB: 6.06 + 1.75 x 1048576 / (0.1299 x 450e3)
    size = 64 * 8192 * 2
    assert engine_allreduce_us(size, 8, 450.0, regimes, line) == pytest.approx(
        6.06 + 1.75 * size / (0.1299 * 450e3), rel=1e-12
    )
    nccl = engine_allreduce_us(CUSTOM_MAX_BYTES + 1, 8, 450.0, regimes, None)
    assert engine_allreduce_us(CUSTOM_MAX_BYTES + 1, 8, 450.0, regimes, line) == nccl
    # a few kilobytes: the custom kernel's ~6 us against NCCL's measured 26.6 us
    assert engine_allreduce_us(8192, 8, 450.0, regimes, line) < 7.0
    assert engine_allreduce_us(8192, 8, 450.0, regimes, None) > 26.0


def test_which_kernels_run() -> None:
    assert custom_line("nccl", 8) is None
    assert custom_line("vllm", 3) == CUSTOM_ALLREDUCE["vllm"][4]  # the next count measured
    assert custom_line("sglang", 16) is None  # beyond a node: NCCL
    assert CostSpec(tp=2).build().allreduce == "sglang"
    assert CostSpec(tp=2).build("vllm").allreduce == "vllm"
    assert CostSpec(tp=2, cpu=CpuSpec(engine="none")).build().allreduce == "nccl"
    assert CostSpec(tp=2, allreduce="nccl").build().allreduce == "nccl"


def test_an_unknown_kernel_is_refused(cli) -> None:
    res = cli("admit", "admit.mode=serving", "admit.cost.allreduce=nvls")
    assert res.exit_code == 2
    assert "admit.cost.allreduce: unknown value 'nvls'" in res.output
    assert "allowed: nccl, sglang, vllm" in res.output
