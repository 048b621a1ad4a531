"""The roofline's inputs are physical: model shapes that hang together, GPUs within what was
ever made, calibrations that never beat the datasheet; every registry entry obeys them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpkv.serving.cost.calibration import calibration_problem
from cpkv.serving.cost.gpus import BANDWIDTH_GB_PER_S, GPUS, PEAK_TFLOPS
from cpkv.serving.cost.shapes import MODELS, SIZE_BOUNDS, shape_problem

LLAMA_70B = MODELS.get("llama-3-70b")  # 64 heads, 8 KV heads


@pytest.mark.parametrize("name", list(MODELS))
def test_every_registered_model_is_consistent_on_every_tp_that_divides_its_heads(name) -> None:
    shape = MODELS.get(name)
    for tp in (1, 2, 4, 8):
        assert shape_problem(shape, tp) is None, (name, tp)


@pytest.mark.parametrize(
    ("change", "tp", "field", "says"),
    [
        ({"kv_heads": 128}, 1, "kv_heads", "at most the 64 attention heads"),
        ({"kv_heads": 6}, 1, "kv_heads", "must divide the 64 attention heads"),
        ({}, 3, "tp", "must divide the model's 64 attention heads"),
        ({"heads": 48, "kv_heads": 12}, 8, "tp", "12 KV heads"),
        ({"hidden": 10**6}, 1, "hidden", "must be <= 131072"),
        ({"layers": 0}, 1, "layers", "must be >= 1"),
        ({"param_bytes": 16}, 1, "param_bytes", "must be <= 8"),
    ],
)
def test_an_impossible_shape_names_the_field_and_the_rule(change, tp, field, says) -> None:
    problem = shape_problem(replace(LLAMA_70B, **change), tp)
    assert problem is not None and problem[0] == field and says in problem[1]


def test_kv_heads_replicated_over_more_gpus_are_consistent() -> None:
    assert shape_problem(LLAMA_70B, 16) is None  # 8 KV heads, each on two of 16 GPUs
    assert shape_problem(LLAMA_70B, 64) is None


@pytest.mark.parametrize("name", list(GPUS))
def test_every_registered_gpu_and_its_calibration_are_within_the_bounds(name) -> None:
    gpu = GPUS.get(name)
    assert PEAK_TFLOPS.problem(gpu.peak_tflops) is None
    for key, bound in BANDWIDTH_GB_PER_S.items():
        assert bound.problem(getattr(gpu, key)) is None, key
    assert calibration_problem(gpu.calibration) is None


def test_a_calibration_beating_the_datasheet_is_named() -> None:
    cal = GPUS.get("h100-sxm").calibration
    assert calibration_problem(replace(cal, elementwise_bw_eff=1.7)) == (
        "elementwise_bw_eff",
        "must be <= 1 (achieved / peak: no kernel beats the datasheet), got 1.7",
    )
    assert calibration_problem(replace(cal, gemm_flops_eff=0.0))[0] == "gemm_flops_eff"


def test_each_size_bound_leaves_room_above_the_largest_registered_model() -> None:
    for field, bound in SIZE_BOUNDS.items():
        largest = max(getattr(MODELS.get(n), field) for n in MODELS)
        assert bound.high >= 2 * largest, field
