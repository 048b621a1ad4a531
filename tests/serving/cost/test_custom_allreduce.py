"""The engines' custom all-reduce (:mod:`cpkv.serving.cost.allreduce`): its shipped lines are
the relative least-squares fits of the published tables (refitted here, the test's float32
values counted as 4 bytes each), within the stated errors; a GPU takes its generation's
table; a message above the largest size measured goes to NCCL; ``admit.cost.allreduce``
follows the CPU's engine."""

from __future__ import annotations

import numpy as np
import pytest

from cpkv.serving.cost.allreduce import (
    CUSTOM_ALLREDUCE,
    CUSTOM_LATENCIES_US,
    CUSTOM_LINK_GB_PER_S,
    CUSTOM_MAX_BYTES,
    CUSTOM_VALUES,
    custom_line,
    engine_allreduce_us,
    regimes_of,
)
from cpkv.serving.cost.cpu import CpuSpec
from cpkv.serving.cost.gpus import GPUS
from cpkv.serving.cost.spec import CostSpec

FLOAT32_BYTES = 4  # the kernel test's values (torch.float32)


def refit(
    times: tuple[float, ...], workers: int, link_gb_per_s: float, bw_eff: float | None = None
) -> tuple[float, float, float, float]:
    """``latency + x / eff`` against the times, minimising the squared relative errors
    (``x`` the ring's bytes at the link's full speed): linear in the latency and ``1/eff``
    (only the latency when ``bw_eff`` is given)."""
    t = np.asarray(times)
    size = FLOAT32_BYTES * np.asarray(CUSTOM_VALUES[: len(t)], float)
    x = 2 * (workers - 1) / workers * size / (link_gb_per_s * 1e3)
    if bw_eff is None:
        a = np.stack([1 / t, x / t], axis=1)
        (latency, inv), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    else:
        inv = 1 / bw_eff
        latency = float(np.sum((1 - x * inv / t) / t) / np.sum(1 / t**2))
    rel = np.abs((latency + x * inv) / t - 1)
    return latency, 1 / inv, float(np.median(rel)), float(rel.max())


@pytest.mark.parametrize("table", ["h100", "a100"])
@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("workers", [2, 4, 8])
def test_the_shipped_lines_are_the_fits_of_the_published_tables(table, kind, workers) -> None:
    times = CUSTOM_LATENCIES_US[table][kind][workers]
    link = CUSTOM_LINK_GB_PER_S[table]
    bw_eff = None
    if len(times) <= 2:  # (two small sizes: their latency, with the bandwidth of 4 GPUs)
        bw_eff = refit(CUSTOM_LATENCIES_US[table][kind][4], 4, link)[1]
    latency, eff, median, worst = refit(times, workers, link, bw_eff)
    assert CUSTOM_ALLREDUCE[table][kind][workers] == pytest.approx((latency, eff), abs=0.006)
    assert median <= 0.12 and worst <= 0.175  # (docs/cost-model.md states each table's)
    # a plausible share of the link: the bytes are the float32 values' (4 each)
    assert 0.3 < eff < 0.8


def test_each_gpu_takes_its_generations_table() -> None:
    for name in ("a100-80gb", "a100-40gb"):
        assert GPUS.get(name).custom_allreduce == "a100"
    for name in ("h100-sxm", "h200", "b200"):
        assert GPUS.get(name).custom_allreduce == "h100"
    assert custom_line("sglang", 8, "a100") == CUSTOM_ALLREDUCE["a100"]["sglang"][8]
    assert custom_line("sglang", 8) == CUSTOM_ALLREDUCE["h100"]["sglang"][8]
    # a 2 KiB all-reduce over 8 A100s takes about the 13.7 µs published for it
    line = custom_line("sglang", 8, "a100")
    assert engine_allreduce_us(2048, 8, 300.0, None, line) == pytest.approx(13.7, rel=0.1)


def test_a_decode_all_reduce_takes_the_custom_line_and_a_large_one_nccl() -> None:
    h100 = GPUS.get("h100-sxm")
    regimes = regimes_of(h100.calibration_for(8))
    line = custom_line("sglang", 8)
    # 64 tokens x 8192 x 2 B = 1 MiB: 6.062 + 1.75 x 1048576 / (0.5198 x 450e3)
    size = 64 * 8192 * 2
    assert engine_allreduce_us(size, 8, 450.0, regimes, line) == pytest.approx(
        6.062 + 1.75 * size / (0.5198 * 450e3), rel=1e-12
    )
    nccl = engine_allreduce_us(CUSTOM_MAX_BYTES + 1, 8, 450.0, regimes, None)
    assert engine_allreduce_us(CUSTOM_MAX_BYTES + 1, 8, 450.0, regimes, line) == nccl
    # a few kilobytes: the custom kernel's ~6 us against NCCL's measured 26.6 us
    assert engine_allreduce_us(8192, 8, 450.0, regimes, line) < 7.0
    assert engine_allreduce_us(8192, 8, 450.0, regimes, None) > 26.0


def test_which_kernels_run() -> None:
    assert custom_line("nccl", 8) is None
    assert custom_line("vllm", 3) == CUSTOM_ALLREDUCE["h100"]["vllm"][4]  # the next count measured
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
