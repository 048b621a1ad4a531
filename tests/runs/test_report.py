"""What a run prints: a long table cut to its first and last rows, the notes, the summary, the
headline last; results.txt keeps every row."""

from __future__ import annotations

from dataclasses import dataclass

from cpkv.runs.report import TERMINAL_HEAD, TERMINAL_TAIL, render
from cpkv.runs.results import RunOutput, RunRecord, metric


@dataclass(frozen=True)
class Row:
    tick: int
    label: str
    tokens: int = metric(unit="tokens")


def record(n: int, label: str = "x") -> RunRecord:
    rows = [Row(t, label, 10 * t) for t in range(n)]
    out = RunOutput(rows=rows, summary={"ticks": n, "headline": {"ticks": n}}, notes=["a note"])
    return RunRecord.from_output("test", "t", out)


def test_a_long_table_shows_its_first_and_last_rows() -> None:
    rec = record(2000)
    text = render(rec, "text", terminal=True)
    lines = text.splitlines()
    body = [ln for ln in lines if ln[:1].isdigit()]
    kept = TERMINAL_HEAD + TERMINAL_TAIL
    assert [int(ln.split()[0]) for ln in body] == [
        *range(TERMINAL_HEAD),
        *range(2000 - TERMINAL_TAIL, 2000),
    ]
    gap = lines.index(f"... {2000 - kept} more rows in results.txt (--full prints them all)")
    assert (
        lines[gap - 1].split()[0] == str(TERMINAL_HEAD - 1) and lines[gap + 1].split()[0] == "1995"
    )
    # the order: table, notes, summary, and the headline last, where the eye lands
    assert (
        text.index("note: a note") < text.index("ticks: 2000") < text.index("headline: ticks=2000")
    )
    assert lines[-1] == "headline: ticks=2000"
    full = render(rec, "text")  # results.txt and --full: every row
    assert len([ln for ln in full.splitlines() if ln[:1].isdigit()]) == 2000
    assert "more rows" not in full


def test_a_short_table_is_whole_and_long_cells_are_cut_on_the_terminal() -> None:
    rec = record(20, label="r" * 200)
    text = render(rec, "text", terminal=True)
    assert (
        "more rows" not in text and len([ln for ln in text.splitlines() if ln[:1].isdigit()]) == 20
    )
    assert "r" * 57 + "..." in text and "r" * 61 not in text
    assert "r" * 200 in render(rec, "text")  # results.txt keeps the whole cell
