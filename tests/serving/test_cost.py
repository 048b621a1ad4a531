"""The serving cost model: hand-checked iteration times, and the fit recovering known
coefficients from synthetic points (exact, noisy, with a zero coefficient, with unused
features), plus the points file's errors."""

from __future__ import annotations

import json
import random

import pytest

from cpkv.core.errors import InputError
from cpkv.serving.cost.fitting.linear import CostPoint, fit_cost, read_points
from cpkv.serving.cost.model import CostModel


def test_iteration_time_by_hand() -> None:
    m = CostModel(
        fixed_us=1000.0,
        prefill_token_us=2.0,
        decode_request_us=10.0,
        context_token_us=0.5,
        kv_bytes_per_token=1000,
        l2_load_gb_per_s=1.0,
    )
    # 1000 bytes per token at 1 GB/s: 1 us per loaded token
    assert m.load_token_us == pytest.approx(1.0)
    # 1000 + 2*100 + 10*3 + 0.5*400 + 1*50 = 1480
    assert m.iteration_us(100, 3, 400, 50) == pytest.approx(1480.0)
    assert CostModel(l2_load_gb_per_s=None).load_token_us == 0.0


def _points(truth: CostModel, n: int, seed: int, noise: float = 0.0, loads: bool = True):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        pre = rng.choice([0, rng.randint(1, 16384)])
        dec = rng.randint(0, 256)
        ctx = rng.randint(0, 2_000_000)
        load = rng.choice([0, rng.randint(1, 50_000)]) if loads else 0
        t = truth.iteration_us(pre, dec, ctx, load)
        out.append(CostPoint(pre, dec, ctx, load, t * (1 + rng.uniform(-noise, noise))))
    return out


def test_fit_recovers_known_coefficients_exactly() -> None:
    truth = CostModel(
        fixed_us=4200.0,
        prefill_token_us=27.5,
        decode_request_us=12.0,
        context_token_us=0.035,
        kv_bytes_per_token=131072,
        l2_load_gb_per_s=25.0,
    )
    fit = fit_cost(_points(truth, 60, seed=1), CostModel(kv_bytes_per_token=131072))
    for got, want in zip(fit.model.coefficients(), truth.coefficients(), strict=True):
        assert got == pytest.approx(want, rel=1e-6)
    assert fit.model.l2_load_gb_per_s == pytest.approx(25.0, rel=1e-6)
    assert fit.rms_error_us == pytest.approx(0.0, abs=1e-3) and fit.r2 == pytest.approx(1.0)
    assert fit.kept == ()


def test_fit_with_noise_is_close_and_reports_its_error() -> None:
    truth = CostModel(
        fixed_us=5000.0, prefill_token_us=30.0, decode_request_us=20.0, context_token_us=0.04
    )
    fit = fit_cost(_points(truth, 400, seed=2, noise=0.02))
    got, want = fit.model.coefficients(), truth.coefficients()
    assert got[1] == pytest.approx(want[1], rel=0.03)
    assert got[3] == pytest.approx(want[3], rel=0.03)
    assert 0 < fit.mean_rel_error_pct < 2.0 and fit.rms_error_us > 0


def test_fit_clamps_at_zero_and_is_the_constrained_optimum() -> None:
    # times fall with more decodes: least squares alone would give a negative decode cost
    rng = random.Random(5)
    pts = []
    for _ in range(50):
        pre, dec, ctx, load = (
            rng.randint(0, 1000),
            rng.randint(0, 100),
            rng.randint(0, 10**5),
            rng.randint(0, 1000),
        )
        t = 2000 + 10 * pre - 3 * dec + 0.01 * ctx + 0.5 * load + rng.uniform(-5, 5)
        pts.append(CostPoint(pre, dec, ctx, load, t))
    fit = fit_cost(pts)
    coef = fit.model.coefficients()
    assert coef[2] == 0.0 and all(c >= 0 for c in coef)
    # KKT: the squared error's gradient is ~0 on positive coefficients and >= 0 at zero ones
    rows = [p.features() for p in pts]
    resid = [
        sum(c * x for c, x in zip(coef, row, strict=True)) - p.time_us
        for row, p in zip(rows, pts, strict=True)
    ]
    for j, c in enumerate(coef):
        grad = sum(r * row[j] for r, row in zip(resid, rows, strict=True))
        scale = sum(abs(r * row[j]) for r, row in zip(resid, rows, strict=True)) + 1e-9
        if c > 0:
            assert abs(grad) / scale < 1e-6, j
        else:
            assert grad > 0, j


def test_feature_never_measured_keeps_the_configured_value() -> None:
    truth = CostModel(
        fixed_us=1000.0, prefill_token_us=10.0, decode_request_us=5.0, context_token_us=0.1
    )
    base = CostModel(l2_load_gb_per_s=12.5)
    fit = fit_cost(_points(truth, 30, seed=4, loads=False), base)
    assert fit.kept == ("load_token_us",)
    assert fit.model.l2_load_gb_per_s == 12.5
    assert fit.model.prefill_token_us == pytest.approx(10.0, rel=1e-6)


def test_fit_needs_enough_points() -> None:
    pts = [CostPoint(1, 2, 3, 4, 100.0), CostPoint(2, 1, 0, 0, 50.0)]
    with pytest.raises(InputError, match="2 points cannot determine 5 coefficients"):
        fit_cost(pts)


def test_points_file_is_read_and_checked(tmp_path) -> None:
    good = tmp_path / "points.jsonl"
    good.write_text(
        json.dumps({"prefill_tokens": 10, "time_us": 12.5})
        + "\n\n"
        + json.dumps({"decode_requests": 3, "context_tokens": 7.5, "time_us": 9})
        + "\n"
    )
    assert read_points(good) == (CostPoint(10, 0, 0, 0, 12.5), CostPoint(0, 3, 7.5, 0, 9.0))
    cases = {
        '{"prefill_tokens": 1}': "field 'time_us' is missing",
        '{"time_us": 0}': "field 'time_us' must be a number > 0",
        '{"time_us": 5, "decode": 1}': "unknown field 'decode'",
        '{"time_us": 5, "loaded_tokens": -1}': "field 'loaded_tokens' must be a number >= 0",
        "[1, 2]": "expected a JSON object",
        "{nope": "not valid JSON",
    }
    for line, message in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"time_us": 1}\n' + line + "\n")
        with pytest.raises(InputError, match=message) as err:
            read_points(bad)
        assert f"{bad}:2:" in str(err.value)
    with pytest.raises(InputError, match="cannot read"):
        read_points(tmp_path / "missing.jsonl")
