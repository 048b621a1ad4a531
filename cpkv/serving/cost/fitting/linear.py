"""Fit the iteration-time cost model to measured iterations (non-negative least squares).

A points file is JSONL, one measured iteration per line::

    {"prefill_tokens": 8192, "decode_requests": 32, "context_tokens": 410000,
     "loaded_tokens": 0, "time_us": 291000.0}

``time_us`` is required (> 0, within the simulation clock's range); the four features
default to 0 (integers or numbers >= 0, at most :data:`MAX_FEATURE`); other keys are
errors. A fit needs more points than the coefficients it determines (as many would be
matched exactly, with no error to judge the fit by). The fit minimises the squared error of
:meth:`~cpkv.serving.cost.model.CostModel.iteration_us` over the points with every
coefficient >= 0. With five unknowns the exact non-negative optimum is found by solving
the unconstrained least squares on every subset of the columns and keeping the best
solution that has no negative coefficient (the optimum's support is one of the subsets).
A feature that is 0 in every point cannot be fitted: its coefficient keeps the configured
value (reported in :attr:`CostFit.kept`). The load coefficient (us per loaded token) is
turned back into ``l2_load_gb_per_s`` with the model's ``kv_bytes_per_token`` (0 -> null:
free load-back).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cpkv.core.errors import InputError
from cpkv.core.files.jsonl import check_fields, parse_object, read_text
from cpkv.core.schema.limits import CLOCK_LIMIT_US, CLOCK_WHY
from cpkv.serving.cost.model import FEATURES, CostModel

MAX_FEATURE = float(2**53)
"""The largest count a feature may hold: float64 holds every integer up to 2**53 exactly."""
COEFFICIENTS = (
    "fixed_us",
    "prefill_token_us",
    "decode_request_us",
    "context_token_us",
    "load_token_us",
)


@dataclass(frozen=True)
class CostPoint:
    """One measured iteration."""

    prefill_tokens: float
    decode_requests: float
    context_tokens: float
    loaded_tokens: float
    time_us: float

    def features(self) -> tuple[float, float, float, float, float]:
        """``(1, prefill, decode, context, loaded)``: the row of the design matrix."""
        return (
            1.0,
            self.prefill_tokens,
            self.decode_requests,
            self.context_tokens,
            self.loaded_tokens,
        )


@dataclass(frozen=True)
class CostFit:
    """The fitted model and how well it fits the points."""

    model: CostModel
    points: int
    rms_error_us: float
    max_abs_error_us: float
    mean_rel_error_pct: float
    r2: float
    kept: tuple[str, ...] = ()  # coefficients not identifiable from the points

    def describe(self) -> dict:
        """Coefficients and errors as a plain dict."""
        return {
            **self.model.describe(),
            "points": self.points,
            "rms_error_us": self.rms_error_us,
            "max_abs_error_us": self.max_abs_error_us,
            "mean_rel_error_pct": self.mean_rel_error_pct,
            "r2": self.r2,
            "kept_from_config": list(self.kept),
        }


def read_points(path: str | Path) -> tuple[CostPoint, ...]:
    """Parse a points file; InputError naming file, line and field for anything wrong."""
    file = Path(path)
    text = read_text(file, "the cost points file")
    allowed = (*FEATURES, "time_us")
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{file}:{lineno}"
        obj = parse_object(line, where)
        check_fields(obj, allowed, where)
        if "time_us" not in obj:
            raise InputError(f"{where}: field 'time_us' is missing (the measured time, > 0)")
        values = []
        for key in allowed:
            v = obj.get(key, 0)
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < 0 or (key == "time_us" and v <= 0):
                need = "a number > 0" if key == "time_us" else "a number >= 0"
                raise InputError(f"{where}: field {key!r} must be {need}, got {v!r}")
            high, why = (
                (CLOCK_LIMIT_US, CLOCK_WHY) if key == "time_us"
                else (MAX_FEATURE, "2**53, the largest count float64 holds exactly")
            )  # fmt: skip
            if v > high:
                raise InputError(f"{where}: field {key!r} must be <= {high:.6g} ({why}), got {v!r}")
            values.append(float(v))
        out.append(CostPoint(*values))
    if not out:
        raise InputError(f"{file}: no cost points (one JSON object per line)")
    return tuple(out)


def fit_cost(
    points: Sequence[CostPoint], base: CostModel | None = None, source: str | None = None
) -> CostFit:
    """Fit ``base``'s coefficients (default: the built-in model) to ``points`` (non-negative
    least squares); InputError (naming ``source``, the points file) when the fit overflows."""
    import numpy as np

    base = base if base is not None else CostModel()

    where = f"{source}: cost fit" if source else "cost fit"
    try:
        with np.errstate(all="ignore"):  # an overflow is refused below, not printed as a warning
            fit = _fit(np, points, base, where)
        values = (*fit.model.coefficients(), fit.rms_error_us, fit.max_abs_error_us,
                  fit.mean_rel_error_pct, fit.r2)  # fmt: skip
        finite = all(math.isfinite(v) for v in values)
    except (np.linalg.LinAlgError, ValueError, OverflowError):
        finite = False
    if not finite:
        largest = max(max(abs(v) for v in (*p.features()[1:], p.time_us)) for p in points)
        raise InputError(
            f"{where}: the points overflow float64 arithmetic (largest value {largest:.3g}), "
            "the fit is not finite; allowed: values whose squares stay finite (below about "
            "1e150): measure in other units"
        )
    return fit


def _fit(np: Any, points: Sequence[CostPoint], base: CostModel, where: str) -> CostFit:
    x = np.array([p.features() for p in points], dtype=float)
    y = np.array([p.time_us for p in points], dtype=float)
    scale = np.abs(x).max(axis=0)
    usable = [j for j in range(x.shape[1]) if scale[j] > 0]
    if len(points) <= len(usable):
        raise InputError(
            f"{where}: {len(points)} points cannot determine {len(usable)} coefficients "
            f"({', '.join(COEFFICIENTS[j] for j in usable)}) and say how well they fit; give "
            f"more than {len(usable)} (as many are matched exactly: a 0% error that says nothing)"
        )
    kept_coef = base.coefficients()
    # features that are never non-zero keep the configured coefficient (they add nothing here)
    offset = sum(kept_coef[j] * x[:, j] for j in range(x.shape[1]) if j not in usable)
    target = y - offset
    xs = x[:, usable] / scale[usable]
    best, best_err = np.zeros(len(usable)), float("inf")
    for size in range(1, len(usable) + 1):
        for subset in itertools.combinations(range(len(usable)), size):
            cols = list(subset)
            sol, *_ = np.linalg.lstsq(xs[:, cols], target, rcond=None)
            if (sol < -1e-12 * max(1.0, float(np.abs(sol).max()))).any():
                continue
            full = np.zeros(len(usable))
            full[cols] = np.clip(sol, 0.0, None)
            err = float(((xs @ full - target) ** 2).sum())
            if err < best_err * (1 - 1e-12):
                best, best_err = full, err
    coef = list(kept_coef)
    for k, j in enumerate(usable):
        coef[j] = float(best[k] / scale[j])
    model = _with_coefficients(base, coef, load_fitted=4 in usable)
    pred = x @ np.array(model.coefficients())
    resid = pred - y
    total = float(((y - y.mean()) ** 2).sum())
    return CostFit(
        model=model,
        points=len(points),
        rms_error_us=float(np.sqrt((resid**2).mean())),
        max_abs_error_us=float(np.abs(resid).max()),
        mean_rel_error_pct=float((np.abs(resid) / y).mean() * 100.0),
        r2=1.0 - float((resid**2).sum()) / total if total > 0 else 1.0,
        kept=tuple(COEFFICIENTS[j] for j in range(x.shape[1]) if j not in usable),
    )


def _with_coefficients(base: CostModel, coef: Sequence[float], load_fitted: bool) -> CostModel:
    fixed, pre, dec, ctx, load = coef
    gbps = base.l2_load_gb_per_s
    if load_fitted:
        gbps = base.kv_bytes_per_token / (load * 1e3) if load > 0 else None
    return replace(
        base,
        fixed_us=fixed,
        prefill_token_us=pre,
        decode_request_us=dec,
        context_token_us=ctx,
        l2_load_gb_per_s=gbps,
    )
