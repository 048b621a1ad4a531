"""Render result records as text, Markdown, CSV or JSON. JSON is the source of truth."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

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
    if fmt == "text" and _plain(body, columns):
        return _simple(body, columns)
    from tabulate import tabulate  # (imported when a table needs it: 30 ms)

    style = "github" if fmt == "markdown" else "simple"
    return tabulate(body, headers=list(columns), tablefmt=style, disable_numparse=True)


def _plain(body: list[list[Any]], columns: Sequence[str]) -> bool:
    """Every cell and header a string or an integer (which tabulate, told not to parse
    numbers, lays out as its text), of printable ASCII characters: what :func:`_simple` lays
    out as tabulate does (the integers made text here); anything else goes to tabulate."""
    pieces = [str(c) for c in columns]
    for cells in body:
        for k, value in enumerate(cells):
            kind = type(value)
            if kind is int:
                cells[k] = value = str(value)
            elif kind is not str:
                return False
        pieces.extend(cells)
    text = "".join(pieces)
    return text.isascii() and text.isprintable()


def _simple(body: list[list[str]], columns: Sequence[str]) -> str:
    """tabulate's ``simple`` table of string cells, character for character (cells stripped,
    left-aligned, two spaces apart; a header at least two characters narrower than its
    column; lines without trailing spaces), in a fraction of its time."""
    heads = [str(c) for c in columns]
    rows = [[value.strip() for value in cells] for cells in body]
    widths = [len(h) + 2 for h in heads]
    for cells in rows:
        widths = [max(w, len(v)) for w, v in zip(widths, cells, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(
        "  ".join(v.ljust(w) for v, w in zip(cells, widths, strict=True)).rstrip() for cells in rows
    )
    return "\n".join(lines)


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


TERMINAL_HEAD, TERMINAL_TAIL = 10, 5
"""A table longer than ``TERMINAL_HEAD + TERMINAL_TAIL + 5`` rows shows its first and last
rows on the terminal (``results.txt`` and ``--full`` hold them all)."""
TERMINAL_CELL = 60
"""Text cells longer than this are cut on the terminal (``...``)."""


def render(
    record: RunRecord,
    fmt: str = "text",
    columns: Sequence[str] | None = None,
    *,
    terminal: bool = False,
) -> str:
    """The whole record in one format; ``text`` is what ``results.txt`` holds.

    Text and Markdown lead with the table, then the notes, then the summary, and end with the
    headline (the few numbers that stand for the run), where the eye lands. ``terminal``:
    a long table keeps its first and last rows, with a line saying how many are left out and
    where they are; long text cells are cut.
    """
    from cpkv.runs.headline import headline

    if fmt == "json":
        return record.to_json()
    cols = list(columns) if columns else record_columns(record)
    if fmt == "csv":
        return table(record.rows, cols, "csv")
    parts = [
        (_cut_table(record.rows, cols, fmt) if terminal else table(record.rows, cols, fmt))
        if record.rows
        else "(no rows)"
    ]
    if record.notes:
        parts.append("\n".join(f"note: {note}" for note in record.notes))
    shown = {k: v for k, v in record.summary.items() if k != "headline"}
    if shown:
        parts.append(summary_text(shown, fmt))
    numbers = headline(record)
    if numbers:
        text = ", ".join(f"{k}={cell(v)}" for k, v in numbers.items())
        parts.append(f"**headline**: {text}" if fmt == "markdown" else f"headline: {text}")
    return "\n\n".join(parts) + "\n"


def _cut_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], fmt: str) -> str:
    """The first and last rows of a long table, a line in between saying how many are left out."""
    short = [{c: _short(row.get(c)) for c in columns} for row in rows]
    if len(rows) <= TERMINAL_HEAD + TERMINAL_TAIL + 5:
        return table(short, columns, fmt)
    kept = short[:TERMINAL_HEAD] + short[-TERMINAL_TAIL:]
    lines = table(kept, columns, fmt).splitlines()
    header = len(lines) - len(kept)  # the header (and rule) lines
    left = len(rows) - len(kept)
    gap = f"... {left} more rows in results.txt (--full prints them all)"
    return "\n".join([*lines[: header + TERMINAL_HEAD], gap, *lines[header + TERMINAL_HEAD :]])


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > TERMINAL_CELL:
        return value[: TERMINAL_CELL - 3] + "..."
    return value


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
