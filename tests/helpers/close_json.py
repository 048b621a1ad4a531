"""Two outputs of runs that made the same decisions: every string, integer, bool and null
equal, every float within floating-point rounding (relative ``rel``; ``printed``: the
absolute unit of the values' printed rounding, for numbers written rounded to 6 places)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def assert_close(a: Any, b: Any, where: str = "", rel: float = 1e-9, printed: float = 2e-6) -> None:
    """``a`` and ``b`` (JSON values) are equal but for rounding (module docstring)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_close(a[key], b[key], f"{where}.{key}", rel, printed)
        return
    if isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{where}: {len(a)} != {len(b)} entries"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, f"{where}[{i}]", rel, printed)
        return
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, int | float) and isinstance(b, int | float), f"{where}: {a!r} != {b!r}"
        if math.isnan(a) and math.isnan(b):
            return
        assert abs(a - b) <= rel * max(abs(a), abs(b)) + printed, f"{where}: {a!r} != {b!r}"
        return
    assert a == b, f"{where}: {a!r} != {b!r}"


def assert_close_lines(a: Path, b: Path, **kw: Any) -> None:
    """Two JSON-lines files, line by line."""
    left, right = a.read_text().splitlines(), b.read_text().splitlines()
    assert len(left) == len(right), f"{a.name}: {len(left)} != {len(right)} lines"
    for k, (x, y) in enumerate(zip(left, right, strict=True)):
        assert_close(json.loads(x), json.loads(y), f"{a.name}:{k + 1}", **kw)
