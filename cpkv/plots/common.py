"""Shared plumbing for plots: the optional matplotlib import, figure saving, labels."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpkv.core.errors import OutputError, UnsupportedError
from cpkv.core.files import reason

_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def require_matplotlib() -> None:
    """UnsupportedError (exit 2) with an install hint when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise UnsupportedError("plots need matplotlib: pip install 'cpkv[plot]'")


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    """Write ``fig`` as a PNG through a temporary name, then close it."""
    plt = pyplot()
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(tmp, dpi=110)
        tmp.replace(path)
    except OSError as err:  # a full disk, a read-only folder: one line naming the file
        raise OutputError(f"{path}: cannot write ({reason(err)})") from None
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)  # a write that failed (full disk) leaves nothing
    return path


def file_stem(prefix: str, values: Mapping[str, Any]) -> str:
    """``latency_op=alloc_total_pages=600`` from a prefix and the values a figure is split on."""
    parts = [prefix, *(f"{k}={label(v)}" for k, v in values.items())]
    return _UNSAFE.sub("-", "_".join(parts))[:120]


def label(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "+".join(map(str, value))
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def varying(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[str]:
    """The columns whose values are not the same in every row."""
    out = []
    for col in columns:
        if len({json.dumps(r.get(col), sort_keys=True) for r in rows}) > 1:
            out.append(col)
    return out


def group_by(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str]
) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Rows grouped by their values of ``columns`` (first-seen order)."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(
            tuple(json.dumps(row.get(c), sort_keys=True) for c in columns), []
        ).append(row)
    return groups


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
