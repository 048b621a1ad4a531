"""What ``cpkv fit-cost --profile`` prints: an ``admit.cost`` block, or the validation table.

The validation table has one row per (GPU, model, TP degree) of every profile folder: the
linear-layer (GEMM) time of one layer predicted by the roofline model against the measured one
over the table's token counts — the median and worst relative error with the GPU's default
calibration (un-fitted to this table) and after fitting to it — the fitted keys, and the errors
of the fitted elementwise kernels and all-reduce. Below it, each GPU's defaults fitted to all of
its tables at once (and its all-reduce at each measured worker count), and whether they are
the ones :mod:`cpkv.serving.cost.gpus` ships.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from cpkv.runs.report import table
from cpkv.serving.cost.calibration import MEASURED
from cpkv.serving.cost.fitting.profiles import profile_folders, read_profile
from cpkv.serving.cost.fitting.roofline import (
    MEDIAN_BOUND_PCT,
    WORST_BOUND_PCT,
    ProfileFit,
    fit_gpu_defaults,
    fit_profile,
)
from cpkv.serving.cost.gpus import GPUS

COLUMNS = (
    "gpu", "model", "tp", "tokens", "default_median_pct", "default_worst_pct",
    "fitted_median_pct", "fitted_worst_pct", "gemm_flops_eff", "gemm_bw_eff", "gemm_latency_us",
    "gemm_tile_tokens", "gemm_corner", "elementwise_median_pct", "elementwise_worst_pct",
    "allreduce_median_pct", "allreduce_worst_pct",
)  # fmt: skip


def profile_block(fit: ProfileFit) -> str:
    """The ``admit.cost`` block of one fit, with the errors as comments."""
    p, cal = fit.profile, fit.calibration
    times = p.by_tp[fit.tp]
    lines = [
        f"# fitted to {p.path} at TP {fit.tp} ({p.gpu}, {p.label}); errors |predicted / measured - 1|:",
        f"#   linear layers, {fit.gemm.points} token counts {times.tokens[0]}..{times.tokens[-1]}: "
        f"median {fit.gemm.median_pct:.1f} %, worst {fit.gemm.worst_pct:.1f} % (at {fit.gemm.worst_at} "
        f"tokens); with the GPU's defaults: median {fit.gemm_default.median_pct:.1f} %, worst "
        f"{fit.gemm_default.worst_pct:.1f} %",
        f"#   elementwise kernels: median {fit.elementwise.median_pct:.1f} %, worst "
        f"{fit.elementwise.worst_pct:.1f} % (at {fit.elementwise.worst_at} tokens)",
    ]
    if fit.allreduce is not None:
        lines.append(
            f"#   all-reduce ({fit.network}, {fit.tp} workers, {fit.allreduce.points} sizes): median "
            f"{fit.allreduce.median_pct:.1f} %, worst {fit.allreduce.worst_pct:.1f} % (at "
            f"{fit.allreduce.worst_at} bytes)"
        )
    elif fit.tp > 1:
        lines.append("#   all-reduce: no network table found; the GPU's defaults are kept")
    lines += [
        "# measured: the keys below; modelled (the GPU's defaults): attention, load-back, overhead",
        "admit:",
        "  cost:",
        "    kind: roofline",
    ]
    if p.model is not None:
        lines.append(f"    model: {p.model}")
    else:
        lines += ["    model: null", "    model_shape:"]
        lines += [
            f"      {f.name}: {str(getattr(p.shape, f.name)).lower()}"
            for f in fields(p.shape)
            if f.name not in ("layers", "hf_id")
        ]
        lines.append("      layers: null  # not in the profile: give the model's layers")
    lines += [f"    gpu: {p.gpu}", f"    tp: {fit.tp}", "    calibration:"]
    for key in fit.fitted_keys:
        value = getattr(cal, key)
        lines.append(f"      {key}: {value if isinstance(value, int) else f'{value:g}'}")
    return "\n".join(lines)


def validation_table(root: str | Path, fmt: str = "text") -> str:
    """The validation table of every profile under ``root`` and the GPUs' defaults."""
    profiles = [read_profile(folder) for folder in profile_folders(root)]
    rows = []
    for profile in profiles:
        for tp in profile.by_tp:
            fit = fit_profile(profile, tp)
            cal, times = fit.calibration, profile.by_tp[tp]
            rows.append(
                {
                    "gpu": profile.gpu,
                    "model": profile.label,
                    "tp": tp,
                    "tokens": f"{times.tokens[0]}..{times.tokens[-1]} ({fit.gemm.points})",
                    "default_median_pct": fit.gemm_default.median_pct,
                    "default_worst_pct": fit.gemm_default.worst_pct,
                    "fitted_median_pct": fit.gemm.median_pct,
                    "fitted_worst_pct": fit.gemm.worst_pct,
                    **{k: _short(getattr(cal, k)) for k in MEASURED[:5]},
                    "elementwise_median_pct": fit.elementwise.median_pct,
                    "elementwise_worst_pct": fit.elementwise.worst_pct,
                    "allreduce_median_pct": fit.allreduce.median_pct if fit.allreduce else None,
                    "allreduce_worst_pct": fit.allreduce.worst_pct if fit.allreduce else None,
                }
            )
    worst = max((r["fitted_worst_pct"] for r in rows), default=0.0)
    median = max((r["fitted_median_pct"] for r in rows), default=0.0)
    ok = worst <= WORST_BOUND_PCT and median <= MEDIAN_BOUND_PCT
    out = [
        table(rows, COLUMNS, fmt),
        "",
        f"linear layers after fitting: largest median {median:.1f} % (bound {MEDIAN_BOUND_PCT:g} %), "
        f"largest worst {worst:.1f} % (bound {WORST_BOUND_PCT:g} %): {'within' if ok else 'OUTSIDE'} the bounds",
        "",
        "GPU defaults (each GPU's measured keys fitted to all its tables at once):",
    ]
    for gpu in sorted({p.gpu for p in profiles}):
        d = fit_gpu_defaults(gpu, profiles)
        shipped = GPUS.get(gpu).calibration
        keys = [
            k
            for k in MEASURED
            if any(k.startswith(x) for x in ("gemm", "elementwise", "allreduce"))
        ]
        shown = ", ".join(f"{k}={_short(getattr(d.calibration, k))}" for k in keys)
        same = all(getattr(d.calibration, k) == getattr(shipped, k) for k in keys)
        same = same and d.allreduce_by_workers == GPUS.get(gpu).allreduce_by_workers
        out.append(
            f"  {gpu}: {shown}; linear layers over its {d.tables} tables: median "
            f"{d.gemm.median_pct:.1f} %, worst {d.gemm.worst_pct:.1f} % "
            f"({'as shipped in cpkv/serving/cost/gpus.py' if same else 'DIFFERENT from cpkv/serving/cost/gpus.py'})"
        )
        for workers, r in d.allreduce_by_workers:
            out.append(
                f"    all-reduce at TP {workers}: allreduce_latency_us={_short(r.latency_us)}, "
                f"allreduce_small_bw_eff={_short(r.small_bw_eff)}, "
                f"allreduce_switch_bytes={r.switch_bytes}, allreduce_bw_eff={_short(r.bw_eff)}"
            )
    return "\n".join(out)


def _short(value: float | int) -> float | int | str:
    return value if isinstance(value, int) else f"{value:g}"
