"""`cpkv diff` on timing rows with raw samples: a burst of noise is not a regression, a real
shift is, many rows of identical code find nothing by chance, and old results without samples
fall back to the interval rule and say so.

The samples are synthetic (seeded), written as results.json rows the way the allocator
benchmarks write them: statistics from :func:`cpkv.core.timing.summarize`, ``samples_us``."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from cpkv.core.timing import summarize
from cpkv.diff.compare import NOISE, WORSE, diff_paths
from cpkv.diff.ranktest import mann_whitney_u
from cpkv.diff.rules import RANK, samples_field
from tests.helpers.paths import SAVED_RUNS

STATS = (
    "mean_us",
    "p25_us",
    "p50_us",
    "p75_us",
    "p95_us",
    "p99_us",
    "min_us",
    "max_us",
    "stdev_us",
)


def make_run(path: Path, rows_samples: list[list[float]], keep_samples: bool = True) -> str:
    """A copy of the hand-made host run whose rows (request_pages 1, 2, ...) hold these samples."""
    shutil.copytree(SAVED_RUNS / "host_base", path)
    doc = json.loads((path / "results.json").read_text())
    template = doc["rows"][0]
    rows = []
    for i, samples in enumerate(rows_samples):
        s = summarize(samples)
        row = {**template, "request_pages": i + 1, "repeat": s.n, "samples_us": list(s.samples_us)}
        row.update({k: getattr(s, k) for k in STATS})
        if not keep_samples:
            del row["samples_us"]
        rows.append(row)
    doc["rows"] = rows
    doc["columns"]["samples"] = ["samples_us"] if keep_samples else []
    doc["columns"]["metrics"] = [*doc["columns"]["metrics"], "p25_us", "p75_us"]
    (path / "results.json").write_text(json.dumps(doc))
    return str(path)


def gauss(seed: int, n: int = 40, mean: float = 10.0, sd: float = 0.6) -> list[float]:
    rng = random.Random(seed)
    return [max(0.1, rng.gauss(mean, sd)) for _ in range(n)]


def test_a_noise_burst_is_not_a_regression(cli, tmp_path: Path) -> None:
    """Same code, two runs; in B a burst on the machine hits 4 of the 40 samples (50x slower).
    B's p99 (and mean) jump far beyond the 1.1 factor, but the ranks of the samples barely
    move: no significant change. The interval rule alone (old results) calls it a regression."""
    burst = gauss(2)
    burst[10:14] = [500.0] * 4
    a = make_run(tmp_path / "a", [gauss(1)])
    b = make_run(tmp_path / "b", [burst])
    d = diff_paths(a, b)
    p99 = next(c for c in d.changes if c.metric == "p99_us")
    assert p99.change_pct > 1000 and p99.rule == RANK and p99.verdict == NOISE
    assert not d.regressions
    res = cli("diff", a, b, output=False)
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1].startswith("verdict: no significant change")
    # the same numbers without their samples: the interval rule sees p95/p99 apart
    old_a = make_run(tmp_path / "old_a", [gauss(1)], keep_samples=False)
    old_b = make_run(tmp_path / "old_b", [burst], keep_samples=False)
    old = diff_paths(old_a, old_b)
    assert {c.metric for c in old.changes if c.verdict == WORSE} >= {"p99_us"}
    res = cli("diff", old_a, old_b, output=False)
    assert res.exit_code == 1 and "by the interval rule" in res.output
    assert "results written before cpkv kept them" in res.output


def test_a_real_shift_is_a_regression(cli, tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", [gauss(1)])
    b = make_run(tmp_path / "b", [[1.3 * v for v in gauss(2)]])
    d = diff_paths(a, b)
    p50 = next(c for c in d.changes if c.metric == "p50_us")
    assert p50.verdict == WORSE and p50.p_value < 1e-6  # 40 vs 40 samples, fully apart
    res = cli("diff", a, b, output=False)
    assert res.exit_code == 1 and "verdict: REGRESSION (rows: 1 of 1 worse)" in res.output
    # --alpha is the significance level: nothing this far apart passes at 1e-30
    assert cli("diff", a, b, "--alpha", "1e-30", output=False).exit_code == 0
    assert cli("diff", a, b, "--alpha", "2", output=False).exit_code == 2


def test_a_tail_that_grew_while_the_samples_got_faster_is_not_worse(tmp_path: Path) -> None:
    """B is faster as a whole (the rank test says so) but two samples make its p99 higher:
    the p99 change goes against the shift the test found, so it is noise; p50 is better."""
    faster = [0.7 * v for v in gauss(2)]
    faster[:2] = [30.0, 31.0]
    d = diff_paths(make_run(tmp_path / "a", [gauss(1)]), make_run(tmp_path / "b", [faster]))
    verdicts = {c.metric: c.verdict for c in d.changes}
    assert verdicts["p50_us"] == "better" and verdicts["p99_us"] == NOISE
    assert not d.regressions


def test_many_rows_of_identical_code_find_nothing_by_chance(tmp_path: Path) -> None:
    """60 rows, both runs drawn from one wide distribution (sd 25 %, 20 samples a row). Taken
    one by one, some rows move more than 10 % with p < 0.05 (shown below, by hand); adjusted
    for the 60 rows tested (Benjamini-Hochberg), none is significant."""
    rows_a = [gauss(1000 + i, n=20, sd=2.5) for i in range(60)]
    rows_b = [gauss(2000 + i, n=20, sd=2.5) for i in range(60)]
    by_chance = 0
    for xs, ys in zip(rows_a, rows_b, strict=True):
        shift = abs(summarize(ys).p50_us / summarize(xs).p50_us - 1)
        by_chance += shift > 0.10 and mann_whitney_u(xs, ys).p_value < 0.05
    assert by_chance >= 1  # what a per-row test would have called significant
    d = diff_paths(make_run(tmp_path / "a", rows_a), make_run(tmp_path / "b", rows_b))
    assert d.tested_rows == 60 and not d.regressions
    assert not [c for c in d.changes if c.verdict in (WORSE, "better")]


def test_ratio_columns_are_reported_not_judged(tmp_path: Path) -> None:
    """vs_reference / vs_fifo_p99 are ratios of two rows' statistics: no samples of their own,
    so their change is 'info' (the rows they come from are rank-tested)."""
    a = make_run(tmp_path / "a", [gauss(1)])
    b = make_run(tmp_path / "b", [gauss(2)])
    for path, ratio in ((a, 2.0), (b, 4.0)):
        doc = json.loads((Path(path) / "results.json").read_text())
        doc["rows"][0]["vs_reference"] = ratio
        doc["columns"]["metrics"].append("vs_reference")
        doc["columns"]["timing"].append("vs_reference")
        (Path(path) / "results.json").write_text(json.dumps(doc))
    d = diff_paths(a, b, metrics=["vs_reference", "p50_us"])
    verdicts = {c.metric: c.verdict for c in d.changes}
    assert verdicts["vs_reference"] == "info" and not d.regressions
    record = json.loads((Path(a) / "results.json").read_text())
    from cpkv.runs.results import RunRecord

    rec = RunRecord.from_json(json.dumps(record))
    assert samples_field(rec, rec.rows[0], "p99_us") == "samples_us"
    assert samples_field(rec, rec.rows[0], "vs_reference") is None


def test_every_row_moving_one_way_gets_a_note(cli, tmp_path: Path) -> None:
    """Three rows, all 30 % slower in B: a regression, and a note that a machine-wide change
    between the runs looks the same."""
    a = make_run(tmp_path / "a", [gauss(i) for i in range(3)])
    b = make_run(tmp_path / "b", [[1.3 * v for v in gauss(10 + i)] for i in range(3)])
    res = cli("diff", a, b, output=False)
    assert res.exit_code == 1
    assert "note: every significant timing change (3 rows) is slower in B" in res.output


def test_summary_ratios_of_timings_are_info(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", [gauss(1)])
    b = make_run(tmp_path / "b", [gauss(1)])
    for path, median in ((a, 7.0), (b, 5.0)):
        doc = json.loads((Path(path) / "results.json").read_text())
        doc["summary"]["vs_reference_p50"] = {"alloc/fifo": {"median": median}}
        (Path(path) / "results.json").write_text(json.dumps(doc))
    d = diff_paths(a, b)
    (c,) = [c for c in d.summary if c.key == "vs_reference_p50.alloc/fifo.median"]
    assert c.verdict == "info" and not d.regressions
