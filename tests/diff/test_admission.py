"""`cpkv diff` of admission runs: the summary first, then one row per request matched on its
rid (never tick k of A against tick k of B), a screenful at most."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cpkv.diff.compare import SAME, WORSE, diff_paths
from tests.helpers.paths import MOONCAKE_TRACE, REPO


def two_runs(cli, *overrides: str) -> tuple[str, str]:
    assert cli("admit").exit_code == 0
    assert cli("admit", *overrides).exit_code == 0
    a, b = cli.run_dirs()
    return str(a), str(b)


def test_requests_are_matched_by_rid_and_the_summary_comes_first(cli) -> None:
    """The seed grid (8 requests): tick 0 admits g0..g6, tick 1 g7. With at most 4 requests a
    batch, g0..g3 still fill tick 0 (the limit refuses only the 5th), so they are unchanged;
    g4, g5 and g6 can no longer be in tick 0: each is admitted later, which is worse."""
    a, b = two_runs(cli, "admit.cp.max_batch_requests=4")
    d = diff_paths(a, b)
    assert d.identity == ["rid"] and d.matched == 8 and not d.only_a and not d.only_b
    ticks = {c.row["rid"]: c for c in d.changes if c.metric == "tick"}
    for rid in ("g0_0_0_128", "g1_0_0_2048", "g2_0_4096_128", "g3_0_4096_2048"):
        assert (ticks[rid].a, ticks[rid].verdict) == (0, SAME)
    for rid in ("g4_4096_0_128", "g5_4096_0_2048", "g6_4096_4096_128"):
        assert ticks[rid].a == 0 and ticks[rid].b >= 1 and ticks[rid].verdict == WORSE
    summary = {c.key: c for c in d.summary}
    assert summary["ticks"].a == 2 and summary["ticks"].b > 2 and summary["ticks"].verdict == WORSE
    stops = summary["stops_by_budget.cp_max_batch_requests"]
    assert stops.a == 0 and stops.b >= 1 and stops.verdict == "changed"  # a count absent in A: 0
    res = cli("diff", a, b, output=False)
    assert res.exit_code == 1
    text = res.output
    assert text.index("admit.cp.max_batch_requests: 8 -> 4") < text.index("summary (A -> B):")
    assert text.index("summary (A -> B):") < text.index("rows (one per admitted request")
    assert "matched on rid: 8 matched" in text
    assert text.splitlines()[-1].startswith("verdict: REGRESSION (summary: 1 worse (ticks); rows: ")


def test_identical_admission_runs_are_quiet(cli) -> None:
    a, b = two_runs(cli)
    res = cli("diff", a, b, output=False)
    assert res.exit_code == 0
    assert res.output.splitlines()[-1] == "verdict: no significant change"
    assert "(no row changed significantly; --all shows every row)" in res.output
    assert len(res.output.splitlines()) < 25


def test_without_ticks_jsonl_the_tick_table_names_the_requests(cli, tmp_path: Path) -> None:
    a, b = two_runs(cli, "admit.cp.max_batch_requests=4")
    for run in (a, b):
        (Path(run) / "ticks.jsonl").unlink()
    d = diff_paths(a, b)
    assert d.identity == ["rid"] and d.matched == 8
    assert d.views == ["one per admitted request, from the tick table (no ticks.jsonl)"]
    moved = {c.row["rid"] for c in d.changes if c.metric == "tick" and c.verdict == WORSE}
    assert moved >= {"g4_4096_0_128", "g5_4096_0_2048", "g6_4096_4096_128"}
    assert not moved & {"g0_0_0_128", "g1_0_0_2048", "g2_0_4096_128", "g3_0_4096_2048"}


@pytest.mark.skipif(not MOONCAKE_TRACE.is_file(), reason=f"trace not found at {MOONCAKE_TRACE}")
def test_a_two_thousand_tick_diff_fits_a_screen(cli, monkeypatch) -> None:
    """The issue's case: the Mooncake trace queue (~2,000 ticks), max_batch_requests 8 -> 4."""
    monkeypatch.chdir(REPO)
    assert cli("admit", "configs/admit_trace.yaml").exit_code == 0
    assert cli("admit", "configs/admit_trace.yaml", "admit.cp.max_batch_requests=4").exit_code == 0
    a, b = cli.run_dirs()
    res = cli("diff", str(a), str(b), output=False)
    lines = res.output.splitlines()
    assert res.exit_code == 1 and len(lines) <= 50, res.output
    assert "stops_by_budget.cp_max_batch_requests" in res.output
    assert "more changed rows (--all shows every row)" in res.output
    full = cli("diff", str(a), str(b), "--all", output=False).output
    assert len(full.splitlines()) > 3993  # every request


def test_a_copy_of_a_run_is_identical(cli, tmp_path: Path) -> None:
    assert cli("admit").exit_code == 0
    (run,) = cli.run_dirs()
    shutil.copytree(run, tmp_path / "copy")
    d = diff_paths(str(run), str(tmp_path / "copy"))
    assert not d.regressions and {c.verdict for c in d.changes} == {SAME}
