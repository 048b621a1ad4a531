"""Render a :class:`cpkv.diff.compare.Diff` as text, Markdown or JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from cpkv.core.schema import to_dict
from cpkv.diff.compare import BETTER, WORSE, Diff, MetricChange
from cpkv.runs.report import table
from cpkv.runs.results import finite_json

DIFF_FORMATS = ("text", "markdown", "json")
RULE = (
    "a timing metric changes when |change| > its threshold and the two rows' intervals do not "
    "overlap (a median: p50 +- 1.58 IQR/sqrt(n); a mean: +- 2 stdev/sqrt(n); else the samples' "
    "p05..p95, value +- stdev or min..max); any other metric when |change| > its threshold"
)


def render_diff(diff: Diff, fmt: str = "text", only_changed: bool = False) -> str:
    if fmt == "json":
        return _json(diff, only_changed)
    md = fmt == "markdown"
    out = [
        f"{'# ' if md else ''}cpkv diff ({diff.kind})",
        f"A: {_code(diff.a, md)}",
        f"B: {_code(diff.b, md)}",
    ]
    out += ["", _heading("config differences (A -> B)", md)]
    out += [f"- {k}: {_val(a)} -> {_val(b)}" for k, a, b in diff.config_changes] or ["(none)"]
    changes = [c for c in diff.changes if not only_changed or c.verdict in (WORSE, BETTER)]
    out += ["", _heading("metrics", md), _rows_line(diff)]
    constant, varying = _split_identity(diff)
    if constant:
        out.append("every row: " + ", ".join(f"{k}={_val(v)}" for k, v in constant.items()))
    out.append("")
    out.append(
        _table(changes, varying, "markdown" if md else "text")
        if changes
        else "(no changed metrics)"
        if only_changed
        else "(no metrics)"
    )
    if diff.outcome_changes:
        out += ["", _heading("outcome changes", md)]
        out += [
            f"- {_label(p, r, varying)} {col}: {_val(a)} -> {_val(b)}"
            for p, r, col, a, b in diff.outcome_changes
        ]
    for title, rows in (("only in A", diff.only_a), ("only in B", diff.only_b)):
        if rows:
            out += ["", _heading(f"rows {title}", md)]
            out += [
                f"- {', '.join(f'{k}={_val(v)}' for k, v in r.items() if k in varying or k == 'point')}"
                for r in rows
            ]
    out += [f"note: {n}" for n in diff.notes]
    out += ["", _verdict(diff), f"rule: {RULE}; thresholds: {_thresholds(diff)}"]
    return "\n".join(out) + "\n"


def _rows_line(diff: Diff) -> str:
    on = ", ".join(diff.identity) or "(no identity columns)"
    return f"rows matched on {on}: {diff.matched} matched, {len(diff.only_a)} only in A, {len(diff.only_b)} only in B"


def _split_identity(diff: Diff) -> tuple[dict[str, Any], list[str]]:
    rows = [c.row for c in diff.changes] + diff.only_a + diff.only_b
    constant, varying = {}, []
    for col in diff.identity:
        values = {json.dumps(r.get(col), sort_keys=True) for r in rows}
        if len(values) == 1 and rows:
            constant[col] = rows[0].get(col)
        else:
            varying.append(col)
    return constant, varying


def _table(changes: Sequence[MetricChange], varying: Sequence[str], fmt: str) -> str:
    has_point = any(c.point for c in changes)
    rows = []
    for c in changes:
        row: dict[str, Any] = {"point": c.point} if has_point else {}
        row.update({k: c.row.get(k) for k in varying})
        row.update(metric=c.metric, A=_num(c.a), B=_num(c.b), ratio=_ratio(c.ratio), change=_pct(c.change_pct),
                   verdict=c.verdict)  # fmt: skip
        rows.append(row)
    columns = (
        (["point"] if has_point else [])
        + list(varying)
        + ["metric", "A", "B", "ratio", "change", "verdict"]
    )
    return table(rows, columns, fmt)


def _verdict(diff: Diff) -> str:
    counts = diff.counts()
    shown = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    state = f"REGRESSION ({len(diff.regressions)} worse)" if diff.regressions else "no regression"
    return f"verdict: {state}; {shown or 'nothing compared'}"


def _thresholds(diff: Diff) -> str:
    given = ", ".join(f"{k}:{v:g}%" for k, v in diff.thresholds.by_name.items())
    return given + ("; " if given else "") + "default timing:10%, other:0%"


def _json(diff: Diff, only_changed: bool) -> str:
    changes = [c for c in diff.changes if not only_changed or c.verdict in (WORSE, BETTER)]
    doc = {
        "a": diff.a, "b": diff.b, "kind": diff.kind,
        "regression": bool(diff.regressions), "counts": diff.counts(),
        "config_changes": [{"key": k, "a": a, "b": b} for k, a, b in diff.config_changes],
        "identity": diff.identity, "matched": diff.matched, "only_a": diff.only_a, "only_b": diff.only_b,
        "changes": [to_dict(c) for c in changes],
        "outcome_changes": [{"point": p, "row": r, "column": col, "a": a, "b": b} for p, r, col, a, b in diff.outcome_changes],
        "notes": diff.notes, "thresholds": dict(diff.thresholds.by_name), "rule": RULE,
    }  # fmt: skip
    return json.dumps(finite_json(doc), indent=1) + "\n"


def _label(point: str | None, row: Mapping[str, Any], varying: Sequence[str]) -> str:
    parts = [f"{k}={_val(row.get(k))}" for k in varying]
    return (f"[{point}] " if point else "") + (", ".join(parts) or "row")


def _heading(text: str, md: bool) -> str:
    return f"## {text}" if md else f"{text}:"


def _code(text: str, md: bool) -> str:
    return f"`{text}`" if md else text


def _val(value: Any) -> str:
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def _num(value: float | None) -> str:
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


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:+.1f}%"
