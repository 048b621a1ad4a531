"""Render result records as text, Markdown, CSV or JSON. JSON is the source of truth."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from cpkv.runs.results import RunRecord

FORMATS = ("text", "markdown", "json", "csv")


def cell(value: Any) -> Any:
    """One table cell: floats with 2 decimals, lists compact, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, list | tuple):
        return ",".join(str(cell(v)) for v in value) if len(value) <= 8 else f"[{len(value)} items]"
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"))
    return value


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], fmt: str = "text") -> str:
    """Rows as a table with the given columns, in ``fmt`` (text, markdown or csv)."""
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_csv(row.get(c)) for c in columns])
        return buf.getvalue()
    body = [[cell(row.get(c)) for c in columns] for row in rows]
    style = "github" if fmt == "markdown" else "simple"
    return tabulate(body, headers=list(columns), tablefmt=style, disable_numparse=True)


def _csv(value: Any) -> Any:
    if isinstance(value, list | tuple | Mapping):
        return json.dumps(value, separators=(",", ":"))
    return "" if value is None else value


def record_columns(record: RunRecord) -> list[str]:
    if record.table_columns:
        return list(record.table_columns)
    if record.rows:
        return list(record.rows[0].keys())
    return []


def render(record: RunRecord, fmt: str = "text", columns: Sequence[str] | None = None) -> str:
    """The whole record in one format; ``text`` is what ``results.txt`` holds."""
    if fmt == "json":
        return record.to_json()
    cols = list(columns) if columns else record_columns(record)
    if fmt == "csv":
        return table(record.rows, cols, "csv")
    parts = [table(record.rows, cols, fmt) if record.rows else "(no rows)"]
    if record.summary:
        parts.append(summary_text(record.summary, fmt))
    for note in record.notes:
        parts.append(f"note: {note}")
    return "\n\n".join(parts) + "\n"


def summary_text(summary: Mapping[str, Any], fmt: str = "text") -> str:
    lines = []
    for key, value in summary.items():
        shown = (
            cell(value)
            if not isinstance(value, Mapping | list)
            else json.dumps(value, separators=(", ", ": "))
        )
        lines.append(f"- {key}: {shown}" if fmt == "markdown" else f"{key}: {shown}")
    return "\n".join(lines)
