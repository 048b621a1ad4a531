"""Fit the roofline model's measured calibration keys to Vidur's GPU profiles, and check it.

What is fitted, to what (:mod:`cpkv.serving.cost.fitting.profiles` reads the tables):

* linear layers — one layer's four GEMMs on one GPU against their measured sum, over the
  table's token counts: ``gemm_tile_tokens`` (32, 64, 128 or 256) and ``gemm_corner`` (0,
  1/4, 1/3, 1/2, 2/3, 1) by trying each, ``gemm_flops_eff`` (<= 1), ``gemm_bw_eff`` and
  ``gemm_latency_us`` by a grid search refined around the best points. The fit minimises
  ``max(worst error / 25 %, median error / 10 %)``, the relative errors ``|predicted /
  measured - 1|``: the validation's two bounds, scaled, so the fit spreads the error where
  the bounds judge it;
* elementwise kernels — their measured sum against ``5·elementwise_latency_us +
  tokens·bytes / (elementwise_bw_eff·W)``: least squares on relative errors (linear in the
  latency and ``1 / efficiency``);
* all-reduce — the single-node table of ``tp`` workers against the latency and two bandwidth
  regimes of :mod:`cpkv.serving.cost.allreduce` (:mod:`cpkv.serving.cost.fitting.allreduce`:
  weighted least squares on relative errors, every octave of sizes weighing the same).

A GPU's defaults are the same fits over every profile table of that GPU at once (all models,
all TP degrees; the all-reduce over every worker count, the fallback for a TP degree the
network table does not hold), and the all-reduce fitted to each worker count's table alone
(the defaults at that TP degree). Numpy is imported here only.

A fit needs more measurements than the numbers it fits (:data:`GEMM_KEYS` token counts per
table, :data:`ALLREDUCE_KEYS` sizes per all-reduce table: as many would be matched exactly, with
an error of 0 % that says nothing), and what it finds must be a calibration the config would
accept (efficiencies in (0, 1], latencies in range: :func:`~cpkv.serving.cost.calibration.
calibration_problem`); anything else is refused naming the profile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cpkv.core.errors import InputError
from cpkv.serving.cost.allreduce import AllReduceRegimes, with_regimes
from cpkv.serving.cost.calibration import Calibration, calibration_problem
from cpkv.serving.cost.fitting.allreduce import fit_allreduce, predict_allreduce_us
from cpkv.serving.cost.fitting.profiles import (
    LinearProfile,
    network_table,
    read_allreduce,
)
from cpkv.serving.cost.gpus import GPUS, Gpu
from cpkv.serving.cost.layers.dense import (
    ACTIVATION_BYTES,
    elementwise_bytes_per_token,
    layer_gemms,
)
from cpkv.serving.cost.layers.timing import ELEMENTWISE_KERNELS

TILES = (32, 64, 128, 256)
CORNERS = (0.0, 0.25, 0.33, 0.5, 0.67, 0.75, 1.0)
MEDIAN_BOUND_PCT, WORST_BOUND_PCT = 10.0, 25.0
FLOPS_EFF_RANGE = (0.2, 1.0)
BW_EFF_RANGE = (0.2, 1.0)
LATENCY_RANGE_US = (0.0, 15.0)
ALLREDUCE_CALIBRATION_KEYS = (
    "allreduce_latency_us", "allreduce_small_bw_eff", "allreduce_switch_bytes", "allreduce_bw_eff",
)  # fmt: skip
GEMM_KEYS = 5  # flops and bandwidth efficiency, latency, tile, corner
PAIR_KEYS = 2  # bandwidth efficiency and latency (elementwise)
ALLREDUCE_KEYS = 4  # latency, two bandwidth efficiencies, the switch between them


@dataclass(frozen=True)
class GemmSet:
    """One table to fit: a model's GEMMs on one GPU at one TP degree, and the measured times."""

    gemms: tuple[tuple[int, int], ...]
    param_bytes: int
    tokens: tuple[int, ...]
    measured_us: tuple[float, ...]


@dataclass(frozen=True)
class Errors:
    """Relative errors of a prediction against measurements, in percent."""

    points: int
    median_pct: float
    worst_pct: float
    worst_at: int  # the token count (or bytes) of the worst point


@dataclass(frozen=True)
class GemmFit:
    """The GEMM calibration keys fitted to one or more tables."""

    flops_eff: float
    bw_eff: float
    latency_us: float
    tile_tokens: int
    corner: float


def gemm_set(profile: LinearProfile, tp: int) -> GemmSet:
    times = profile.by_tp[tp]
    return GemmSet(
        layer_gemms(profile.shape, tp), profile.shape.param_bytes, times.tokens, times.gemm_us
    )


def predict_gemm_us(s: GemmSet, gpu: Gpu, fit: GemmFit) -> Any:
    """One layer's GEMM time at each of ``s.tokens`` (numpy), as
    :meth:`~cpkv.serving.cost.roofline.RooflineCost.gemm_us` computes it."""
    import numpy as np

    c0, w0 = _unit_terms(np, s, gpu, fit.tile_tokens)
    parts = _combine(np, c0 / fit.flops_eff, w0 / fit.bw_eff, fit.corner)
    return parts.sum(axis=0) + len(s.gemms) * fit.latency_us


def errors(np: Any, predicted: Any, measured: Any, at: Sequence[int]) -> Errors:
    rel = np.abs(np.asarray(predicted) / np.asarray(measured) - 1.0) * 100.0
    i = int(np.argmax(rel))
    return Errors(len(rel), float(np.median(rel)), float(rel[i]), int(at[i]))


def fit_gemm(sets: Sequence[GemmSet], gpu: Gpu) -> GemmFit:
    """The GEMM keys that minimise the worst of ``max(worst / 25 %, median / 10 %)`` over
    ``sets`` (see the module docstring)."""
    import numpy as np

    candidates = []
    for tile in TILES:
        units = [(_unit_terms(np, s, gpu, tile), np.asarray(s.measured_us)) for s in sets]
        for corner in CORNERS:
            grids = (
                np.linspace(*FLOPS_EFF_RANGE, 9),
                np.linspace(*BW_EFF_RANGE, 9),
                np.linspace(*LATENCY_RANGE_US, 6),
            )
            score, point = _grid_best(np, units, corner, grids)
            candidates.append((score, tile, corner, point))
    candidates.sort(key=lambda c: c[0])
    best = None
    for _, tile, corner, point in candidates[:3]:
        units = [(_unit_terms(np, s, gpu, tile), np.asarray(s.measured_us)) for s in sets]
        steps = [0.1, 0.1, 3.0]
        for _ in range(6):
            grids = tuple(
                np.clip(point[k] + steps[k] * np.linspace(-1, 1, 9), *bounds)
                for k, bounds in enumerate((FLOPS_EFF_RANGE, BW_EFF_RANGE, LATENCY_RANGE_US))
            )
            score, point = _grid_best(np, units, corner, grids)
            steps = [s / 3 for s in steps]
        if best is None or score < best[0]:
            best = (score, tile, corner, point)
    assert best is not None
    _, tile, corner, (flops_eff, bw_eff, latency) = best
    return GemmFit(
        round(float(flops_eff), 4), round(float(bw_eff), 4), round(float(latency), 3), tile, corner
    )


def fit_elementwise(profiles: Sequence[tuple[LinearProfile, int]], gpu: Gpu) -> tuple[float, float]:
    """``(elementwise_bw_eff, elementwise_latency_us)`` for the tables (profile, tp)."""
    import numpy as np

    rows, target = [], []
    for profile, tp in profiles:
        times = profile.by_tp[tp]
        per_token_us = elementwise_bytes_per_token(profile.shape, tp) / (gpu.hbm_gb_per_s * 1e3)
        for t, y in zip(times.tokens, times.elementwise_us, strict=True):
            rows.append((ELEMENTWISE_KERNELS / y, t * per_token_us / y))
            target.append(1.0)
    latency, inverse_eff = _nonneg_lstsq(np, np.array(rows), np.array(target))
    return _efficiency(inverse_eff), round(latency, 3)


def predict_elementwise_us(
    profile: LinearProfile, tp: int, gpu: Gpu, bw_eff: float, latency_us: float
) -> Any:
    import numpy as np

    tokens = np.asarray(profile.by_tp[tp].tokens, dtype=float)
    per_token = elementwise_bytes_per_token(profile.shape, tp) / (bw_eff * gpu.hbm_gb_per_s * 1e3)
    return ELEMENTWISE_KERNELS * latency_us + tokens * per_token


def _efficiency(inverse: float) -> float:
    """The efficiency whose inverse was fitted (inf when the fit found none: refused later)."""
    return round(1.0 / inverse, 4) if inverse > 0 and math.isfinite(inverse) else math.inf


# -- one table, and every table ------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileFit:
    """The calibration of one (profile, TP) and how well it and the GPU's defaults fit."""

    profile: LinearProfile
    tp: int
    calibration: Calibration  # the GPU's defaults with the fitted keys replaced
    fitted_keys: tuple[str, ...]
    gemm: Errors
    gemm_default: Errors
    elementwise: Errors
    allreduce: Errors | None  # None: tp 1, or no network table
    network: str | None


def fit_profile(profile: LinearProfile, tp: int, network: str | Path | None = None) -> ProfileFit:
    """Fit one TP degree of a profile (its all-reduce from ``network``, default the sibling
    ``network_<gpu>_dgx/all_reduce.csv`` when present)."""
    import numpy as np

    if tp not in profile.by_tp:
        raise InputError(
            f"{profile.path}: no rows for TP {tp} (the table has TP {', '.join(map(str, profile.by_tp))})"
        )
    gpu = GPUS.get(profile.gpu)
    base = gpu.calibration_for(tp)
    s = gemm_set(profile, tp)
    _enough(len(s.tokens), GEMM_KEYS, f"{profile.path}: TP {tp}", "token counts")
    fit = fit_gemm([s], gpu)
    measured = np.asarray(s.measured_us)
    default = GemmFit(
        base.gemm_flops_eff,
        base.gemm_bw_eff,
        base.gemm_latency_us,
        base.gemm_tile_tokens,
        base.gemm_corner,
    )
    gemm = errors(np, predict_gemm_us(s, gpu, fit), measured, s.tokens)
    gemm_default = errors(np, predict_gemm_us(s, gpu, default), measured, s.tokens)
    e_eff, e_lat = fit_elementwise([(profile, tp)], gpu)
    times = profile.by_tp[tp]
    elementwise = errors(
        np,
        predict_elementwise_us(profile, tp, gpu, e_eff, e_lat),
        times.elementwise_us,
        times.tokens,
    )
    cal = replace(
        base,
        gemm_flops_eff=fit.flops_eff, gemm_bw_eff=fit.bw_eff, gemm_latency_us=fit.latency_us,
        gemm_tile_tokens=fit.tile_tokens, gemm_corner=fit.corner,
        elementwise_bw_eff=e_eff, elementwise_latency_us=e_lat,
    )  # fmt: skip
    keys = ["gemm_flops_eff", "gemm_bw_eff", "gemm_latency_us", "gemm_tile_tokens", "gemm_corner",
            "elementwise_bw_eff", "elementwise_latency_us"]  # fmt: skip
    allreduce, used = None, None
    table = Path(network) if network is not None else network_table(profile.path)
    if tp > 1 and (network is not None or table.is_file()):
        by_n = read_allreduce(table)
        if tp not in by_n:
            raise InputError(
                f"{table}: no single-node rows for {tp} workers (has {', '.join(map(str, by_n))})"
            )
        _enough(len(by_n[tp].sizes), ALLREDUCE_KEYS, f"{table}: {tp} workers", "sizes")
        regimes = fit_allreduce([(tp, by_n[tp])], gpu.nvlink_gb_per_s)
        pred = predict_allreduce_us(tp, by_n[tp], gpu.nvlink_gb_per_s, regimes)
        allreduce = errors(np, pred, by_n[tp].time_us, by_n[tp].sizes)
        cal = with_regimes(cal, regimes)
        keys += list(ALLREDUCE_CALIBRATION_KEYS)
        used = str(table)
    _check_fitted(cal, f"{profile.path}: TP {tp}")
    return ProfileFit(
        profile, tp, cal, tuple(keys), gemm, gemm_default, elementwise, allreduce, used
    )


@dataclass(frozen=True)
class GpuDefaults:
    """A GPU's measured calibration keys fitted to all its tables at once."""

    gpu: str
    calibration: Calibration
    gemm: Errors  # over every table of the GPU together
    tables: int
    allreduce_by_workers: tuple[tuple[int, AllReduceRegimes], ...] = ()


def fit_gpu_defaults(gpu_name: str, profiles: Sequence[LinearProfile]) -> GpuDefaults:
    """The measured keys of ``gpu_name`` fitted jointly to every table of ``profiles`` on it
    (all TP degrees) and to its network table (every worker count) when present."""
    import numpy as np

    gpu = GPUS.get(gpu_name)
    mine = [p for p in profiles if p.gpu == gpu_name]
    pairs = [(p, tp) for p in mine for tp in p.by_tp]
    sets = [gemm_set(p, tp) for p, tp in pairs]
    where = f"{gpu_name}'s profiles ({', '.join(p.path for p in mine)})"
    _enough(sum(len(s.tokens) for s in sets), GEMM_KEYS, where, "token counts")
    fit = fit_gemm(sets, gpu)
    pred = np.concatenate([predict_gemm_us(s, gpu, fit) for s in sets])
    measured = np.concatenate([np.asarray(s.measured_us) for s in sets])
    at = [t for s in sets for t in s.tokens]
    e_eff, e_lat = fit_elementwise(pairs, gpu)
    cal = replace(
        gpu.calibration,
        gemm_flops_eff=fit.flops_eff, gemm_bw_eff=fit.bw_eff, gemm_latency_us=fit.latency_us,
        gemm_tile_tokens=fit.tile_tokens, gemm_corner=fit.corner,
        elementwise_bw_eff=e_eff, elementwise_latency_us=e_lat,
    )  # fmt: skip
    table = network_table(mine[0].path) if mine else None
    by_workers: list[tuple[int, AllReduceRegimes]] = []
    if table is not None and table.is_file():
        tables = sorted(read_allreduce(table).items())
        for n, times in tables:
            _enough(len(times.sizes), ALLREDUCE_KEYS, f"{table}: {n} workers", "sizes")
            regimes = fit_allreduce([(n, times)], gpu.nvlink_gb_per_s)
            _check_fitted(with_regimes(cal, regimes), f"{table}: {n} workers")
            by_workers.append((n, regimes))
        cal = with_regimes(cal, fit_allreduce(tables, gpu.nvlink_gb_per_s))
    _check_fitted(cal, where)
    return GpuDefaults(gpu_name, cal, errors(np, pred, measured, at), len(sets), tuple(by_workers))


def _enough(points: int, keys: int, where: str, what: str) -> None:
    """InputError unless ``points`` measurements can fit ``keys`` numbers and show an error."""
    if points <= keys:
        raise InputError(
            f"{where}: {points} {what} cannot fit {keys} calibration numbers and say how well "
            f"they fit; allowed: more than {keys} (as many are matched exactly: a 0% error "
            "that says nothing)"
        )


def _check_fitted(cal: Calibration, where: str) -> None:
    """InputError when the fit found a calibration the config would refuse."""
    problem = calibration_problem(cal)
    if problem is not None:
        key, why = problem
        raise InputError(
            f"{where}: the fitted {key} {why}: the measured times are not those of this GPU "
            "(faster than its datasheet allows, or not the operators' times)"
        )


# -- internals -----------------------------------------------------------------------------------


def _unit_terms(np: Any, s: GemmSet, gpu: Gpu, tile: int) -> tuple[Any, Any]:
    """Per GEMM and token count: compute and memory time at efficiency 1 (us)."""
    tokens = np.asarray(s.tokens, dtype=float)
    padded = np.ceil(tokens / tile) * tile
    flops_us, bytes_us = gpu.peak_tflops * 1e6, gpu.hbm_gb_per_s * 1e3
    c0 = np.array([2.0 * k * n / flops_us * padded for k, n in s.gemms])
    w0 = np.array(
        [
            (k * n * s.param_bytes + tokens * (k + n) * ACTIVATION_BYTES) / bytes_us
            for k, n in s.gemms
        ]
    )
    return c0, w0


def _combine(np: Any, c: Any, m: Any, corner: float) -> Any:
    if corner == 0.0:
        return np.maximum(c, m)
    if corner == 1.0:
        return c + m
    top = np.maximum(c, m)
    p = 1.0 / corner
    with np.errstate(invalid="ignore", divide="ignore"):
        out = top * ((c / top) ** p + (m / top) ** p) ** corner
    return np.where(top > 0, out, 0.0)


def _grid_best(
    np: Any, units: list, corner: float, grids: tuple
) -> tuple[float, tuple[float, float, float]]:
    """The grid point of (flops_eff, bw_eff, latency) with the lowest score, and the score."""
    eff_f, eff_b, lat = grids
    total = None
    for (c0, w0), y in units:
        g = c0.shape[0]
        base = _combine(
            np,
            c0[None, None] / eff_f[:, None, None, None],
            w0[None, None] / eff_b[None, :, None, None],
            corner,
        ).sum(axis=2)  # (flops_eff, bw_eff, points)
        pred = base[:, :, None, :] + g * lat[None, None, :, None]
        rel = np.abs(pred / y - 1.0) * 100.0
        score = np.maximum(
            rel.max(axis=3) / WORST_BOUND_PCT, np.median(rel, axis=3) / MEDIAN_BOUND_PCT
        )
        total = score if total is None else np.maximum(total, score)
    assert total is not None
    i, j, k = np.unravel_index(int(np.argmin(total)), total.shape)
    return float(total[i, j, k]), (float(eff_f[i]), float(eff_b[j]), float(lat[k]))


def _nonneg_lstsq(np: Any, x: Any, y: Any) -> tuple[float, float]:
    """Least squares for two coefficients, the first (a latency) kept >= 0."""
    sol, *_ = np.linalg.lstsq(x, y, rcond=None)
    if sol[0] < 0:
        slope = float((x[:, 1] @ y) / (x[:, 1] @ x[:, 1]))
        return 0.0, slope
    return float(sol[0]), float(sol[1])
