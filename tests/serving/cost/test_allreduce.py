"""The all-reduce's latency and two bandwidth regimes: the formula's properties, the roofline
using it, and the shipped fits against the measured DGX tables (skipped without ../shared)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cpkv.serving.cost.allreduce import AllReduceRegimes, allreduce_us, regimes_of, ring_factor
from cpkv.serving.cost.fitting.allreduce import (
    fit_allreduce,
    predict_allreduce_us,
    switch_candidates,
)
from cpkv.serving.cost.fitting.profiles import AllReduceTimes, read_allreduce
from cpkv.serving.cost.gpus import GPUS
from cpkv.serving.cost.roofline import RooflineCost
from cpkv.serving.cost.shapes import MODELS
from tests.helpers.paths import SHARED

NETWORK = {
    "a100-80gb": SHARED / "data" / "gpu_profiles" / "network_a100_dgx" / "all_reduce.csv",
    "h100-sxm": SHARED / "data" / "gpu_profiles" / "network_h100_dgx" / "all_reduce.csv",
}
DECODE_BYTES = 4096 * 2  # one token of a 4096-hidden model in BF16
SMALL_BYTES = 64 * 1024  # a decode step of up to 8 such tokens
LARGE_BYTES = 4 * 1024 * 1024  # 512 tokens and more: a prefill chunk's


def _shipped() -> list[tuple[str, int, AllReduceRegimes]]:
    """Each measured GPU's regimes: of all worker counts (workers 0) and of each."""
    out = []
    for name in NETWORK:
        gpu = GPUS.get(name)
        out.append((name, 0, regimes_of(gpu.calibration)))
        out += [(name, n, r) for n, r in gpu.allreduce_by_workers]
    return out


def _tables(gpu: str) -> dict[int, AllReduceTimes]:
    if not NETWORK[gpu].is_file():
        pytest.skip(f"{NETWORK[gpu]} is not present")
    return read_allreduce(NETWORK[gpu])


# -- the formula ------------------------------------------------------------------------------


def test_one_worker_has_no_all_reduce() -> None:
    r = AllReduceRegimes(10.0, 0.1, 1 << 20, 0.5)
    assert allreduce_us(1 << 20, 1, 300.0, r) == 0.0
    model = RooflineCost(MODELS.get("llama-2-7b"), GPUS.get("a100-80gb"), 1)
    assert model.breakdown(0, 1, 1024, 0, 0, 0)[4] == 0.0
    assert model.breakdown(4096, 0, 0, 4096, 4096 * 4097 // 2, 0)[4] == 0.0


def test_the_regimes_by_hand() -> None:
    # 4 workers: ring factor 2*3/4 = 1.5; link 100 GB/s = 1e5 B/us; switch 1e5 bytes
    r = AllReduceRegimes(5.0, 0.25, 100_000, 0.5)
    assert ring_factor(4) == 1.5
    # below the switch: 5 + 1.5 * 4e4 / (0.25 * 1e5) = 5 + 2.4
    assert allreduce_us(40_000, 4, 100.0, r) == pytest.approx(7.4, rel=1e-12)
    # above: 5 + 1.5 * (1e5 / 2.5e4 + 3e5 / 5e4) = 5 + 1.5 * (4 + 6) = 20
    assert allreduce_us(400_000, 4, 100.0, r) == pytest.approx(20.0, rel=1e-12)
    # switch 0: one latency and one bandwidth, 5 + 1.5 * 4e5 / 5e4 = 17
    one = AllReduceRegimes(5.0, 0.25, 0, 0.5)
    assert allreduce_us(400_000, 4, 100.0, one) == pytest.approx(17.0, rel=1e-12)


@pytest.mark.parametrize(("gpu", "workers", "regimes"), _shipped())
def test_shipped_regimes_rise_with_the_bytes_and_join_at_the_switch(gpu, workers, regimes) -> None:
    link = GPUS.get(gpu).nvlink_gb_per_s
    n = workers or 8
    sizes = np.unique(np.geomspace(1, 1 << 30, 4000).astype(np.int64)).astype(float)
    times = allreduce_us(sizes, n, link, regimes, np.minimum)
    assert np.all(np.diff(times) >= 0)
    s = float(regimes.switch_bytes)
    below, above = (
        allreduce_us(s - 1e-6, n, link, regimes),
        allreduce_us(s + 1e-6, n, link, regimes),
    )
    assert above - below == pytest.approx(0.0, abs=1e-6)
    assert allreduce_us(0.0, n, link, regimes) == regimes.latency_us


def test_the_roofline_pays_two_all_reduces_a_layer_from_the_formula() -> None:
    shape, gpu = MODELS.get("llama-2-7b"), GPUS.get("a100-80gb")
    for tp in (2, 4, 8):
        model = RooflineCost(shape, gpu, tp)
        regimes = dict(gpu.allreduce_by_workers)[tp]
        for tokens in (1, 64, 4096):
            one = allreduce_us(tokens * shape.hidden * 2, tp, gpu.nvlink_gb_per_s, regimes)
            comm = model.breakdown(tokens, 0, 0, tokens, tokens * (tokens + 1) // 2, 0)[4]
            assert comm == pytest.approx(shape.layers * 2 * one, rel=1e-12)


def test_a_fit_recovers_known_regimes() -> None:
    sizes = tuple(int(s) for s in np.unique(np.geomspace(2048, 1 << 26, 300).astype(int)))
    grid = switch_candidates([(4, AllReduceTimes(sizes, (1.0,) * len(sizes)))])
    switch = min(grid, key=lambda c: abs(c - 262144))  # one the fit tries
    truth = AllReduceRegimes(12.0, 0.05, switch, 0.6)
    times = AllReduceTimes(sizes, tuple(allreduce_us(float(s), 4, 300.0, truth) for s in sizes))
    fit = fit_allreduce([(4, times)], 300.0)
    assert fit.switch_bytes == switch
    assert fit.latency_us == pytest.approx(12.0, abs=1e-3)
    assert (fit.small_bw_eff, fit.bw_eff) == pytest.approx((0.05, 0.6), abs=1e-4)


# -- against the measured tables --------------------------------------------------------------


@pytest.mark.parametrize("gpu", list(NETWORK))
def test_each_worker_count_fits_its_measured_table(gpu) -> None:
    """Median error 5 % at every size and at prefill sizes; the large sizes' worst 35 % (the
    tables step by up to 30 % where NCCL changes algorithm, e.g. at 4 MiB on H100)."""
    link = GPUS.get(gpu).nvlink_gb_per_s
    tables = _tables(gpu)
    assert sorted(tables) == [n for n, _ in GPUS.get(gpu).allreduce_by_workers] == [2, 4, 8]
    for n, regimes in GPUS.get(gpu).allreduce_by_workers:
        times = tables[n]
        sizes, measured = np.asarray(times.sizes), np.asarray(times.time_us)
        error = np.abs(predict_allreduce_us(n, times, link, regimes) / measured - 1) * 100
        large = sizes >= LARGE_BYTES
        assert np.median(error) <= 5.0, (gpu, n, np.median(error))
        assert np.median(error[large]) <= 5.0, (gpu, n)
        assert np.max(error[large]) <= 35.0, (gpu, n, np.max(error[large]))


def test_small_messages_fit_the_measured_tables_typically() -> None:
    """At most 64 KiB the repetitions jump between two modes (7 and 36 us at 2 H100s), so the
    bound is on the typical error: the median over both GPUs' small sizes, 25 %."""
    errors = []
    for gpu in NETWORK:
        link = GPUS.get(gpu).nvlink_gb_per_s
        tables = _tables(gpu)
        for n, regimes in GPUS.get(gpu).allreduce_by_workers:
            times = tables[n]
            small = np.asarray(times.sizes) <= SMALL_BYTES
            rel = predict_allreduce_us(n, times, link, regimes) / np.asarray(times.time_us) - 1
            errors += list(np.abs(rel[small]) * 100)
    assert len(errors) >= 6 * 8
    assert np.median(errors) <= 25.0


def test_a100_decode_all_reduce_is_cheaper_than_one_fixed_latency() -> None:
    """One latency and one bandwidth fitted to every A100 size and worker count, each point
    alike (least squares on relative errors), puts about 34 us on every all-reduce; the
    measured kilobyte-sized ones take less, and so do the fitted regimes at every TP."""
    gpu = GPUS.get("a100-80gb")
    tables = _tables("a100-80gb")
    rows, link_us = [], gpu.nvlink_gb_per_s * 1e3
    for n, times in tables.items():
        for size, y in zip(times.sizes, times.time_us, strict=True):
            rows.append((1.0 / y, ring_factor(n) * size / link_us / y))
    (latency, _), *_ = np.linalg.lstsq(np.array(rows), np.ones(len(rows)), rcond=None)
    assert 25.0 < latency < 45.0
    for tp in (2, 4, 8):
        regimes = dict(gpu.allreduce_by_workers)[tp]
        assert allreduce_us(DECODE_BYTES, tp, gpu.nvlink_gb_per_s, regimes) < latency
        measured_small = [
            y for s, y in zip(tables[tp].sizes, tables[tp].time_us, strict=True) if s <= 20480
        ]
        assert min(measured_small) < latency


def test_calibration_for_an_unmeasured_tp_is_the_joint_fit() -> None:
    gpu = GPUS.get("h100-sxm")
    assert gpu.calibration_for(16) == gpu.calibration
    assert (
        gpu.calibration_for(4).allreduce_latency_us == dict(gpu.allreduce_by_workers)[4].latency_us
    )
    assert math.isfinite(gpu.calibration_for(2).allreduce_small_bw_eff)
