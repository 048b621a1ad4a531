"""Calibration of the roofline model on GPU profiles: the validation bounds on the shared Vidur
profiles (skipped without ../shared), the shipped presets and GPU defaults being what the fit
gives, the fit recovering known numbers from a synthetic profile, and bad profile files."""

from __future__ import annotations

import csv
import itertools

import pytest

from cpkv.core.config import load_config
from cpkv.core.errors import InputError
from cpkv.serving.cost.calibration import MEASURED
from cpkv.serving.cost.fitting.profiles import GEMM_OPS, profile_folders, read_profile
from cpkv.serving.cost.fitting.roofline import (
    CORNERS,
    MEDIAN_BOUND_PCT,
    WORST_BOUND_PCT,
    GemmFit,
    GemmSet,
    fit_gpu_defaults,
    fit_profile,
    predict_gemm_us,
)
from cpkv.serving.cost.gpus import GPUS
from cpkv.serving.cost.layers.dense import layer_gemms
from cpkv.serving.cost.roofline import RooflineCost
from cpkv.serving.cost.shapes import MODELS, ModelShape
from tests.helpers.paths import CONFIGS, SHARED

PROFILES = SHARED / "data" / "gpu_profiles"
needs_profiles = pytest.mark.skipif(
    not PROFILES.exists(), reason="../shared/data/gpu_profiles is not present"
)


@needs_profiles
def test_every_shipped_profile_fits_within_the_bounds() -> None:
    folders = profile_folders(PROFILES)
    assert len(folders) == 4
    seen = []
    for folder in folders:
        profile = read_profile(folder)
        for tp in (1, 2, 4, 8):
            fit = fit_profile(profile, tp)
            seen.append((profile.gpu, profile.model, tp))
            assert fit.gemm.median_pct <= MEDIAN_BOUND_PCT, (profile.path, tp, fit.gemm)
            assert fit.gemm.worst_pct <= WORST_BOUND_PCT, (profile.path, tp, fit.gemm)
            assert fit.gemm.points >= 259
            if tp > 1:  # the DGX all-reduce tables were found and fitted
                assert fit.allreduce is not None and fit.allreduce.median_pct < 15
    assert {(g, m) for g, m, _ in seen} == {
        ("a100-80gb", "llama-3-8b"), ("a100-80gb", "llama-3-70b"),
        ("h100-sxm", "llama-2-7b"), ("h100-sxm", "llama-2-70b"),
    }  # fmt: skip


@needs_profiles
@pytest.mark.parametrize(
    ("config", "folder", "tp"),
    [
        ("serving_azure_conv_llama3_8b_a100.yaml", "a100_meta-llama_Meta-Llama-3-8B", 1),
        ("serving_azure_code_llama2_70b_h100x4.yaml", "h100_meta-llama_Llama-2-70b-hf", 4),
    ],
)
def test_shipped_presets_hold_the_fitted_numbers(config, folder, tp) -> None:
    block = load_config("admit", CONFIGS / "admit" / config).experiment.admit.cost
    fit = fit_profile(read_profile(PROFILES / folder), tp)
    model = block.build()
    assert isinstance(model, RooflineCost) and model.tp == tp
    for key in fit.fitted_keys:
        assert getattr(model.calibration, key) == getattr(fit.calibration, key), key


@needs_profiles
@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_gpu_defaults_are_the_joint_fit(gpu) -> None:
    profiles = [read_profile(f) for f in profile_folders(PROFILES)]
    defaults = fit_gpu_defaults(gpu, profiles)
    shipped = GPUS.get(gpu).calibration
    for key in MEASURED:
        assert getattr(defaults.calibration, key) == getattr(shipped, key), key
    assert defaults.allreduce_by_workers == GPUS.get(gpu).allreduce_by_workers
    assert defaults.tables == 8


@pytest.mark.parametrize("corner", CORNERS)
def test_vectorised_prediction_is_the_models(corner) -> None:
    shape = MODELS.get("codellama-34b")
    gpu = GPUS.get("a100-80gb")
    fit = GemmFit(0.7, 0.85, 3.0, 64, corner)
    cal = gpu.calibration
    from dataclasses import replace

    model = RooflineCost(
        shape, gpu, 2,
        replace(cal, gemm_flops_eff=0.7, gemm_bw_eff=0.85, gemm_latency_us=3.0, gemm_tile_tokens=64, gemm_corner=corner),
    )  # fmt: skip
    tokens = (1, 7, 64, 65, 300, 4096)
    s = GemmSet(layer_gemms(shape, 2), 2, tokens, (1.0,) * len(tokens))
    predicted = predict_gemm_us(s, gpu, fit)
    assert list(predicted) == pytest.approx([model.gemm_us(t) for t in tokens], rel=1e-12)


def _synthetic_profile(tmp_path, truth: GemmFit):
    """A Vidur-style mlp.csv for a model not in the registry, timed by ``truth``; the other
    operators share ``1 us + 0.02 us`` per token (well within the GPU's bandwidth)."""
    folder = tmp_path / "h100_acme_Tiny-1B"
    folder.mkdir()
    shape = ModelShape(1, 2048, 16, 4, 128, 5632, True, 32000)
    gpu = GPUS.get("h100-sxm")
    ops = ("emb", "input_layernorm", *GEMM_OPS[:1], "attn_rope", *GEMM_OPS[1:2],
           "post_attention_layernorm", *GEMM_OPS[2:3], "mlp_act", *GEMM_OPS[3:], "add")  # fmt: skip
    header = [f"time_stats.{op}.{s}" for op in ops for s in ("min", "max", "mean", "median", "std")]
    header += ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp",
               "num_tokens", "num_tensor_parallel_workers"]  # fmt: skip
    tokens = [1, 2, 4, *range(8, 2049, 8)]
    with (folder / "mlp.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for tp in (1, 2):
            s = GemmSet(layer_gemms(shape, tp), 2, tuple(tokens), (1.0,) * len(tokens))
            total = predict_gemm_us(s, gpu, truth)
            for t, us in zip(tokens, total, strict=True):
                row = []
                for op in ops:
                    # the four GEMMs share the layer's time equally: only their sum is read
                    ms = us / 4 / 1000 if op in GEMM_OPS else (1.0 + 0.02 * t) / 5000
                    row += [ms, ms, ms, ms, 0.0]
                row += [16, 4, 2048, 5632, 32000, True, t, tp]
                w.writerow(row)
    return folder


def test_fit_cost_recovers_a_synthetic_profile(cli, tmp_path) -> None:
    truth = GemmFit(0.62, 0.81, 3.5, 128, 0.5)
    folder = _synthetic_profile(tmp_path, truth)
    res = cli("fit-cost", "--profile", str(folder), "--tp", "2", output=False)
    assert res.exit_code == 0, res.output
    out = res.output
    assert "    model: null" in out and "      layers: null" in out and "    tp: 2" in out
    assert "all-reduce: no network table found" in out
    fit = fit_profile(read_profile(folder), 2)
    # the fit finds the truth's tile and corner, and the time within a fraction of a percent
    assert (fit.calibration.gemm_tile_tokens, fit.calibration.gemm_corner) == (128, 0.5)
    assert fit.gemm.worst_pct < 1.0
    assert fit.calibration.gemm_flops_eff == pytest.approx(0.62, abs=0.02)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda rows: [rows[0][:-1]] + rows[1:],
            "header lacks column(s) num_tensor_parallel_workers",
        ),
        (
            lambda rows: rows[:1] + [rows[1][:-1] + ["x"]] + rows[2:],
            "column 'num_tensor_parallel_workers' must be an integer >= 1, got 'x'",
        ),
        (
            lambda rows: (
                rows[:1] + [["nan" if i == 13 else c for i, c in enumerate(rows[1])]] + rows[2:]
            ),
            "column 'time_stats.attn_pre_proj.median' must be a finite number",
        ),
        (lambda rows: rows[:1] + [rows[1][:5]] + rows[2:], ":2: 5 columns; the header names"),
        (lambda rows: rows[:1], "no rows"),
    ],
)
def test_bad_profile_is_one_line(tmp_path, mutate, message) -> None:
    folder = _synthetic_profile(tmp_path, GemmFit(0.7, 0.9, 2.0, 64, 0.0))
    rows = list(csv.reader((folder / "mlp.csv").open()))
    with (folder / "mlp.csv").open("w", newline="") as f:
        csv.writer(f).writerows(mutate(rows))
    with pytest.raises(InputError) as err:
        read_profile(folder)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_fit_cost_usage_errors(cli, tmp_path) -> None:
    folder = _synthetic_profile(tmp_path, GemmFit(0.7, 0.9, 2.0, 64, 0.0))
    for args, message in [
        ((), "give POINTS.jsonl (kind linear) or --profile DIR (kind roofline)"),
        (("--profile", str(folder), "--tp", "8"), "no rows for TP 8 (the table has TP 1, 2)"),
        (
            ("--profile", str(folder), "--table", "--format", "html"),
            "--format: unknown format 'html'",
        ),
        (("--profile", str(tmp_path / "nope")), "not a folder"),
        (("--profile", str(tmp_path)), "holds no mlp.csv"),
    ]:
        res = cli("fit-cost", *args, output=False)
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    renamed = folder.rename(tmp_path / "tpu_acme_Tiny")
    res = cli("fit-cost", "--profile", str(renamed), output=False)
    assert res.exit_code == 2 and "does not say the GPU" in res.output


@needs_profiles
def test_the_profiles_name_the_registry_models() -> None:
    for folder, name in itertools.product(profile_folders(PROFILES), [None]):
        profile = read_profile(folder)
        assert profile.model in MODELS and name is None
        assert profile.shape == MODELS.get(profile.model)
