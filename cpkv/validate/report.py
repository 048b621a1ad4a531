"""Every case of a folder of ``configs/validation/`` files: published against predicted.

For each published metric the error is ``predicted / published − 1`` (signed: negative is a
prediction below the measurement); the summary gives the median and the worst ``|error|``
over all metrics of all cases. Each case's prefill and decode iterations are checked against
their physical bounds (:func:`cpkv.validate.predict.bounds`): a prediction below one is listed
as a violation (the command then exits 1).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from cpkv.core.errors import ConfigError
from cpkv.validate.case import ValidationCase, read_case
from cpkv.validate.predict import bounds, predict

COLUMNS = ("case", "metric", "published", "predicted", "error_pct", "gpu", "model", "setup")


@dataclass(frozen=True)
class Report:
    """The rows (one a published metric), the errors' summary and the bounds broken."""

    rows: list[dict[str, object]]
    median_pct: float
    worst_pct: float
    worst_case: str
    violations: list[str]


def case_files(paths: list[Path]) -> list[Path]:
    """The YAML files of ``paths`` (folders read for ``*.yaml``, in name order)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.yaml"))
            if not found:
                raise ConfigError(f"{path}: holds no validation case (*.yaml)")
            files += found
        elif path.exists():
            files.append(path)
        else:
            raise ConfigError(f"{path}: no such file or folder")
    return files


def evaluate(case: ValidationCase) -> tuple[list[dict[str, object]], list[str]]:
    """One case's rows and its bound violations."""
    spec = case.cost
    cost = spec.build(spec.cpu.engine or "sglang")
    gpus = spec.tp * spec.pp
    got = predict(cost, case.batch, case.prompt_tokens, case.output_tokens, gpus)
    rows = []
    for metric, published in case.published.items():
        predicted = got.metrics.get(metric)
        if predicted is None:
            raise ConfigError(f"{case.name}: published.{metric} needs a decode iteration "
                              f"(output_tokens >= 2), got {case.output_tokens}")  # fmt: skip
        rows.append({
            "case": case.name, "metric": metric, "published": published,
            "predicted": round(predicted, 4),
            "error_pct": round(100.0 * (predicted / published - 1.0), 2),
            "gpu": f"{gpus} x {spec.gpu}", "model": spec.model or "model_shape",
            "setup": case.setup,
        })  # fmt: skip
    least = bounds(cost, case.batch, case.prompt_tokens, case.output_tokens)
    first, last, _ = got.decode_us
    times = {"prefill": got.prefill_us, "first_decode": first, "last_decode": last}
    violations = [
        f"{case.name}: {part} predicted {times[part]:.3f} us, below the physical bound "
        f"{least[part]:.3f} us"
        for part in least
        if times[part] and times[part] < least[part]
    ]
    return rows, violations


def validate(paths: list[Path]) -> Report:
    """Every case of ``paths`` (module docstring)."""
    rows: list[dict[str, object]] = []
    violations: list[str] = []
    for path in case_files(paths):
        case_rows, broken = evaluate(read_case(path))
        rows += case_rows
        violations += broken
    errors = [abs(float(r["error_pct"])) for r in rows]  # type: ignore[arg-type]
    worst = max(range(len(rows)), key=lambda i: errors[i])
    return Report(
        rows, round(statistics.median(errors), 2), round(errors[worst], 2),
        str(rows[worst]["case"]), violations,
    )  # fmt: skip
