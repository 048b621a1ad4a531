"""How ``cpkv diff`` writes one value or one change in a table cell or a verdict line.

Numbers get four significant digits; byte counts (``*_bytes``) decimal units (``2.15 GB``);
a change is ``+7.4%``, or ``new`` when it grows from a zero base (a percentage of 0 means
nothing), never ``inf``.
"""

from __future__ import annotations

import json
import math
from typing import Any

NEW = "new"
"""The change of a value that was 0 in A and is not in B."""
_BYTE_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def num(value: float | None) -> str:
    """Four significant digits, without exponents for everyday magnitudes."""
    if value is None:
        return "-"
    if value == 0 or not math.isfinite(value) or not 1e-4 <= abs(value) < 1e12:
        return f"{value:.4g}"
    if value.is_integer():
        return str(int(value))
    decimals = min(6, max(0, 3 - math.floor(math.log10(abs(value)))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def pct(value: float | None) -> str:
    """A change in percent; an infinite one (from a zero base) is :data:`NEW`."""
    if value is None:
        return "-"
    return NEW if math.isinf(value) else f"{value:+.1f}%"


def change_of(a: float | None, b: float | None) -> float | None:
    """(B - A) / |A| in percent; inf when A is 0 and B is not; None when either is missing."""
    if a is None or b is None:
        return None
    if a == 0:
        return 0.0 if b == 0 else math.inf
    return (b - a) / abs(a) * 100.0


def amount(value: Any, key: str = "") -> str:
    """A value of metric ``key``: bytes in decimal units, other numbers by :func:`num`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else clip(val(value), 40)
    if key.endswith("_bytes") and abs(value) >= 1e3:
        for scale, unit in _BYTE_UNITS:
            if abs(value) >= scale:
                return f"{num(float(f'{value / scale:.3g}'))} {unit}"
    return num(float(value))


def val(value: Any) -> str:
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def show(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else clip(val(value), 40)
    return num(float(value))


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
