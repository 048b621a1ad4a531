"""Where tests find the repository, its configs, the test data and ../shared."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
TEST_DATA = REPO / "tests" / "data"
SAVED_RUNS = TEST_DATA / "runs"
SHARED = REPO.parent / "shared"
MOONCAKE_TRACE = SHARED / "data" / "mooncake_synthetic_trace.jsonl"


def check_printed(run: Path, output: str) -> None:
    """What a run command printed: the table (a long one cut to its first and last rows),
    notes, summary and headline re-rendered from results.json, then the run's path; and
    results.txt holds the whole table."""
    from cpkv.runs.report import render
    from cpkv.runs.results import RunRecord

    record = RunRecord.from_json((run / "results.json").read_text())
    assert render(record, "text", terminal=True) + f"{run}\n" in output
    assert (run / "results.txt").read_text() == render(record, "text")
    assert "more rows in results.txt" not in (run / "results.txt").read_text()
