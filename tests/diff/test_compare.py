"""`cpkv diff`: matching rows, thresholds, the noise rule, exit codes, formats (hand-made fixtures)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cpkv.core.errors import ConfigError
from cpkv.diff.compare import NOISE, SAME, WORSE, Thresholds, compare_metric, diff_paths, spread
from cpkv.runs.results import Columns, RunRecord
from tests.helpers.paths import REPO, SAVED_RUNS

DATA = SAVED_RUNS
BASE, SLOWER, NOISY = (str(DATA / n) for n in ("host_base", "host_slower", "host_noisy"))


def verdicts(diff) -> dict[tuple[str, str, str], str]:
    return {
        (c.row["method"], str(c.row["request_pages"]), c.metric): c.verdict for c in diff.changes
    }


def test_identical_runs_show_no_change(cli) -> None:
    for fmt in ("text", "markdown", "json"):
        res = cli("diff", BASE, BASE, "--format", fmt, output=False)
        assert res.exit_code == 0, res.output
    d = diff_paths(BASE, BASE)
    assert d.matched == 2 and not d.only_a and not d.only_b and not d.config_changes
    assert {c.verdict for c in d.changes} == {SAME}
    # the kind's table metrics are compared: 4 timings + contiguous_ratio per row
    assert sorted({c.metric for c in d.changes}) == [
        "contiguous_ratio",
        "mean_us",
        "p50_us",
        "p95_us",
        "p99_us",
    ]


def test_a_planted_regression_exits_1(cli) -> None:
    res = cli("diff", BASE, SLOWER, output=False)
    assert res.exit_code == 1
    d = diff_paths(BASE, SLOWER)
    v = verdicts(d)
    assert v[("contiguous", "8", "p50_us")] == WORSE  # 100 -> 150, spreads 95..105 / 145..155
    assert v[("fifo", "8", "p50_us")] == SAME  # +4% is within the default factor 1.1
    (c,) = [c for c in d.changes if c.row["method"] == "contiguous" and c.metric == "p50_us"]
    assert (c.a, c.b, c.ratio, c.change_pct) == (100.0, 150.0, 1.5, 50.0)
    assert [(r["method"], r["request_pages"]) for r in d.only_b] == [("fifo", 64)] and not d.only_a
    assert d.config_changes == [("alloc_host.request_pages", [8], [8, 64])]
    text = res.output
    # config differences, then the summary, then the rows; the verdict is the last line
    assert text.index("config differences") < text.index("summary (A -> B):") < text.index("rows:")
    assert "- alloc_host.request_pages: [8] -> [8, 64]" in text
    assert text.splitlines()[-1] == "verdict: REGRESSION (rows: 1 of 2 worse)"
    assert "rows only in B:\n- method=fifo, request_pages=64" in text
    # the changed row, one line: its metrics that moved, A -> B (change)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("contiguous")]
    assert line.split()[:5] == ["contiguous", "8", "100", "->", "150"] and line.endswith("worse")
    # these saved rows have no raw samples: the interval rule judged them, and the output says so
    assert "4 by the interval rule" in text


def test_threshold_option_and_only_changed(cli) -> None:
    res = cli("diff", BASE, SLOWER, "--threshold", "timing:60%", output=False)
    assert res.exit_code == 0, res.output  # +50% .. +45% are within 60%
    res = cli(
        "diff", BASE, SLOWER, "-t", "timing:60", "-t", "p50_us:5", "--only-changed", output=False
    )
    assert res.exit_code == 1
    rows = [ln.split() for ln in res.output.splitlines() if ln.startswith(("fifo", "contiguous"))]
    # only the significant change is listed (the default now): contiguous p50 100 -> 150;
    # p95 (+45%), p99 (+42%) and the mean (+49%) are within 60%
    assert rows == [["contiguous", "8", "100", "->", "150", "(+50.0%)", "worse"]]
    assert "2 rows compared: 1 worse, 1 same (metrics: 1 worse)" in res.output
    assert res.output.splitlines()[-1] == "verdict: REGRESSION (rows: 1 of 2 worse)"


def test_noise_does_not_count_and_better_is_reported(cli) -> None:
    d = diff_paths(BASE, NOISY)
    v = verdicts(d)
    assert v[("contiguous", "8", "p50_us")] == NOISE  # +30%, but 95..105 and 90..170 overlap
    assert v[("fifo", "8", "contiguous_ratio")] == "better"  # 0 -> 0.5, higher is better
    res = cli("diff", BASE, NOISY, "--format", "json", output=False)
    assert res.exit_code == 0
    doc = json.loads(res.output)
    assert (
        doc["regression"] is False and doc["counts"]["noise"] >= 1 and doc["counts"]["better"] == 1
    )


def test_spread_rule_by_hand() -> None:
    assert spread({"p50_us": 10, "p05_us": 8, "p95_us": 13, "stdev_us": 1}, "p50_us") == (8, 13)
    assert spread({"p50_us": 10, "stdev_us": 2, "min_us": 1, "max_us": 99}, "p50_us") == (8, 12)
    assert spread({"alloc_p99_ms": 5, "alloc_min_ms": 4, "alloc_max_ms": 7}, "alloc_p99_ms") == (
        4,
        7,
    )
    assert spread({"tokens": 5}, "tokens") is None
    cols = Columns(("k",), ("p50_us", "hits"), ("p50_us",), (), ("p50_us",))
    rec = RunRecord("x", "x", cols, [], {})
    th = Thresholds.parse(["hits:0"])
    # no spread columns: the threshold alone decides
    assert (
        compare_metric(None, {}, "p50_us", {"p50_us": 10}, {"p50_us": 12}, rec, th).verdict == WORSE
    )
    assert (
        compare_metric(None, {}, "p50_us", {"p50_us": 10}, {"p50_us": 10.9}, rec, th).verdict
        == SAME
    )
    assert (
        compare_metric(None, {}, "p50_us", {"p50_us": 10}, {"p50_us": 7}, rec, th).verdict
        == "better"
    )
    # hits is higher-is-better (not in lower_is_better): fewer hits is worse
    assert compare_metric(None, {}, "hits", {"hits": 4}, {"hits": 3}, rec, th).verdict == WORSE


def test_threshold_syntax() -> None:
    th = Thresholds.parse(["p99_us:20%", "timing:15", "*:1"])
    assert (th.pct("p99_us", True), th.pct("p50_us", True), th.pct("hits", False)) == (20, 15, 1)
    assert Thresholds().factor_for("p50_us") == 1.1 and Thresholds().pct("hits", False) == 0
    for bad in ("p50_us", "p50_us:x", ":5", "p50_us:-1"):
        with pytest.raises(ConfigError, match="expected METRIC:PCT"):
            Thresholds.parse([bad])


def test_unusable_input_exits_2(cli, tmp_path: Path) -> None:
    cases = {
        str(DATA / "admit_ticks"): "is kind 'admit' but",
        str(DATA / "old_schema"): "schema_version 0 is not supported",
        str(tmp_path): "neither a run directory",
        str(tmp_path / "nope"): "no such directory",
    }
    for other, message in cases.items():
        res = cli("diff", BASE, other, output=False)
        assert res.exit_code == 2, (other, res.output)
        assert message in res.output and res.output.startswith("cpkv: error: ")


def test_no_matching_rows_is_unusable_and_says_why(cli, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(DATA / "host_base", other)
    doc = json.loads((other / "results.json").read_text())
    for row in doc["rows"]:
        row["repeat"] = 20
    (other / "results.json").write_text(json.dumps(doc))
    res = cli("diff", BASE, str(other), output=False)
    assert res.exit_code == 2
    assert "no rows matched (they differ in repeat: --ignore repeat)" in res.output
    res = cli("diff", BASE, str(other), "--ignore", "repeat", output=False)
    assert res.exit_code == 0 and "2 matched" in res.output
    assert cli("diff", BASE, str(other), "--ignore", "p50_us", output=False).exit_code == 2


def test_metric_option(cli) -> None:
    res = cli("diff", BASE, SLOWER, "--metric", "contiguous_ratio", output=False)
    assert res.exit_code == 0 and "p50_us" not in res.output.split("\nrows:")[1]
    assert cli("diff", BASE, SLOWER, "--metric", "nope", output=False).exit_code == 2


def test_spread_of_a_statistic_with_its_sample_count() -> None:
    """With ``repeat`` in the row the interval is the statistic's, not the samples'."""
    median = {"p50_us": 10, "p25_us": 8, "p75_us": 12, "repeat": 16, "stdev_us": 9}
    assert spread(median, "p50_us") == pytest.approx((10 - 1.58, 10 + 1.58))  # 1.58 * 4 / 4
    assert spread({"mean_us": 10, "stdev_us": 3, "repeat": 9}, "mean_us") == (8, 12)  # 2*3/3
    assert spread({"p99_us": 10, "stdev_us": 3, "repeat": 9}, "p99_us") == (7, 13)  # samples'
    assert spread({"p50_us": 10, "p25_us": 8, "p75_us": 12}, "p50_us") is None  # no n, no sd


def test_one_outlier_does_not_hide_a_shifted_median() -> None:
    """p50 4 -> 6 us with tight quartiles is a regression even when one 17 us outlier makes
    the stdev as large as the shift (value +- stdev would call it noise)."""
    cols = Columns(("k",), ("p50_us",), ("p50_us",), (), ("p50_us",))
    rec = RunRecord("alloc_host", "x", cols, [], {})
    a = {"p50_us": 4.0, "p25_us": 3.8, "p75_us": 4.2, "stdev_us": 3.0, "repeat": 20}
    b = {"p50_us": 6.0, "p25_us": 5.7, "p75_us": 6.4, "stdev_us": 3.0, "repeat": 20}
    assert compare_metric(None, {}, "p50_us", a, b, rec, Thresholds()).verdict == WORSE
    wide = {**b, "p25_us": 3.0, "p75_us": 12.0}  # quartiles that do reach back: noise
    assert compare_metric(None, {}, "p50_us", a, wide, rec, Thresholds()).verdict == NOISE


def test_runs_whose_rows_share_no_identity_are_unusable(cli, monkeypatch) -> None:
    """Seed 004's block policies (rows per request) against its iteration policy (rows per
    tick): no row can match, so the diff refuses instead of pairing rows by position."""
    monkeypatch.chdir(REPO)
    for config in ("configs/admit/seed004_blocks.yaml", "configs/admit/seed004_iteration.yaml"):
        assert cli("admit", config).exit_code == 0
    a, b = sorted(cli.run_dirs())
    res = cli("diff", str(a), str(b), output=False)
    assert res.exit_code == 2, res.output
    assert "share no identity column" in res.output and res.output.startswith("cpkv: error: ")
    assert len(res.output.strip().splitlines()) == 1


def test_markdown_is_a_report_with_a_table(cli) -> None:
    res = cli("diff", BASE, SLOWER, "--format", "markdown", output=False)
    assert res.exit_code == 1
    lines = res.output.splitlines()
    assert lines[0] == "# cpkv diff (alloc_host)"
    assert "## config differences (A -> B)" in lines and "## rows only in B" in lines
    header = next(i for i, ln in enumerate(lines) if ln.startswith("| method"))
    assert set(lines[header + 1].replace("|", "")) <= {"-", " "}  # the separator row
    row = [c.strip() for c in lines[header + 2].strip("|").split("|")]
    assert row[:3] == ["contiguous", "8", "100 -> 150 (+50.0%)"] and row[-1] == "worse"
