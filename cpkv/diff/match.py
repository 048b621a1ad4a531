"""Matching two runs: their config differences, their rows keyed by identity."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def config_changes(a: Any, b: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Dotted keys whose values differ between two config trees (lists compared whole)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for key in [*a, *(k for k in b if k not in a)]:
            out.extend(
                config_changes(a.get(key, _MISSING), b.get(key, _MISSING), f"{prefix}{key}.")
            )
        return out
    return [] if a == b else [(prefix.rstrip("."), _shown(a), _shown(b))]


_MISSING = object()


def _shown(value: Any) -> Any:
    return "(absent)" if value is _MISSING else value


def index_rows(
    rows: Sequence[Mapping[str, Any]], identity: Sequence[str]
) -> dict[tuple[str, ...], Mapping[str, Any]]:
    """Rows keyed by their identity values (a repeated identity gets an occurrence number)."""
    out: dict[tuple[str, ...], Mapping[str, Any]] = {}
    for row in rows:
        key = tuple(json.dumps(row.get(c), sort_keys=True) for c in identity)
        n = 0
        while (*key, str(n)) in out:
            n += 1
        out[(*key, str(n))] = row
    return out


def column_values(rows: Sequence[Mapping[str, Any]], column: str) -> set[str]:
    return {json.dumps(r.get(column), sort_keys=True) for r in rows}
