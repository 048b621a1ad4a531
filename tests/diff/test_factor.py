"""A timing change counts only when significant *and* larger than a factor (``--factor``,
default 1.1 either way), in a plain diff of saved samples and in a rerun's paired rounds.

Every sample here is synthetic and seeded; each test first checks the property its input is
meant to have (significant, beyond the factor, noisy), so that it fails rather than passes
when the input does not say what the test claims."""

from __future__ import annotations

import math
import random

import pytest

from cpkv.core.errors import ConfigError
from cpkv.core.timing import summarize
from cpkv.diff.compare import BETTER, NOISE, SAME, WORSE, Rerun, Thresholds, diff_paths
from cpkv.diff.ranktest import mann_whitney_u
from cpkv.diff.rerun.paired import betainc, paired_test, t_two_sided
from cpkv.diff.rerun.rounds import judge_rounds
from cpkv.diff.rules import PAIRED, RANK
from cpkv.runs.results import Columns, RunRecord
from tests.diff.test_noise import gauss, make_run


def _p50(d, row: int = 0):
    return [c for c in d.changes if c.metric == "p50_us"][row]


# -- the factor on saved samples (a plain diff) -----------------------------------------------


def test_a_significant_5_percent_shift_is_within_the_factor(cli, tmp_path) -> None:
    xs = gauss(1, n=100, sd=0.2)
    ys = [1.05 * v for v in gauss(2, n=100, sd=0.2)]
    assert mann_whitney_u(xs, ys).p_value < 1e-6  # the shift is real
    a, b = make_run(tmp_path / "a", [xs]), make_run(tmp_path / "b", [ys])
    c = _p50(diff_paths(a, b))
    assert 1.0 < c.ratio < 1.1 and c.verdict == SAME and c.rule is None
    assert cli("diff", a, b, output=False).exit_code == 0
    # the factor, not the test, is what let it pass: at factor 1.01 it is a regression
    c = _p50(diff_paths(a, b, Thresholds.parse([], factor=1.01)))
    assert c.verdict == WORSE and c.rule == RANK
    res = cli("diff", a, b, "--factor", "1.01", output=False)
    assert res.exit_code == 1 and res.output.splitlines()[-1].startswith("verdict: REGRESSION")


def test_a_significant_30_percent_shift_is_flagged(cli, tmp_path) -> None:
    a = make_run(tmp_path / "a", [gauss(1)])
    b = make_run(tmp_path / "b", [[1.3 * v for v in gauss(2)]])
    c = _p50(diff_paths(a, b))
    assert c.ratio > 1.1 and c.verdict == WORSE and c.p_value < 0.05
    faster = make_run(tmp_path / "c", [[v / 1.3 for v in gauss(2)]])
    assert _p50(diff_paths(a, faster)).verdict == BETTER
    assert cli("diff", a, b, output=False).exit_code == 1
    # a factor above the change lets it through, significant as it is
    assert cli("diff", a, b, "--factor", "2", output=False).exit_code == 0


def test_a_big_but_noisy_change_is_noise(tmp_path) -> None:
    xs = [5.0, 20.0, 8.0, 15.0, 10.0, 12.0, 30.0, 6.0]
    ys = [6.0, 22.0, 9.0, 18.0, 14.0, 11.0, 4.0, 25.0]
    assert summarize(ys).p50_us / summarize(xs).p50_us > 1.1  # beyond the factor
    assert mann_whitney_u(xs, ys).p_value > 0.05  # and not significant
    c = _p50(diff_paths(make_run(tmp_path / "a", [xs]), make_run(tmp_path / "b", [ys])))
    assert c.verdict == NOISE and c.rule == RANK


def test_the_factor_is_symmetric() -> None:
    """B/A > F or A/B > F: 100 -> 90.5 is beyond 1.1 (100 / 90.5 = 1.105), 100 -> 109 is not."""
    th = Thresholds()
    assert th.exceeds("p50_us", True, 100.0, 90.5) and th.exceeds("p50_us", True, 100.0, 111.0)
    assert not th.exceeds("p50_us", True, 100.0, 109.0)
    assert not th.exceeds("p50_us", True, 100.0, 91.5)  # 100 / 91.5 = 1.093
    assert th.exceeds("p50_us", True, 0.0, 1.0)  # from nothing: beyond any factor


def test_thresholds_and_the_factor_combine() -> None:
    """A timing's limit: a threshold naming it, else ``timing``, as 1 + PCT/100; else the
    factor. ``*`` and ``other`` set the other metrics' limits only."""
    th = Thresholds.parse(["p99_us:20", "timing:15", "*:50"], factor=1.3)
    assert th.factor_for("p99_us") == pytest.approx(1.2)
    assert th.factor_for("p50_us") == pytest.approx(1.15)
    assert th.pct("hits") == 50
    only_star = Thresholds.parse(["*:50"], factor=1.3)
    assert only_star.factor_for("p50_us") == 1.3 and only_star.pct("hits") == 50
    assert Thresholds().factor_for("p50_us") == 1.1 and Thresholds().pct("hits") == 0
    for bad in (0.9, -1.0, math.inf, math.nan):
        with pytest.raises(ConfigError, match="--factor"):
            Thresholds.parse([], factor=bad)


def test_factor_option_errors(cli, tmp_path) -> None:
    a = make_run(tmp_path / "a", [gauss(1)])
    for args in (["--factor", "0.5"], ["--rounds", "3"], ["-o", str(tmp_path / "o")]):
        res = cli("diff", a, a, *args, output=False)
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "o").exists()


# -- the paired test ----------------------------------------------------------------------------


def test_student_t_against_closed_forms() -> None:
    """1 degree of freedom is Cauchy, 2 have a closed form; the 95 % points of the tables."""
    for t in (0.2, 1.0, 3.0, 30.0):
        assert t_two_sided(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, rel=1e-9)
        assert t_two_sided(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-9)
    for df, t95 in ((4, 2.776445), (10, 2.228139), (30, 2.042272)):
        assert t_two_sided(t95, df) == pytest.approx(0.05, abs=1e-6)
    assert t_two_sided(0.0, 5) == 1.0 and t_two_sided(math.inf, 5) == 0.0
    # I_x(a, b) for whole a, b is P(Binomial(a + b - 1, x) >= a)
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(1 - 0.6**4 - 4 * 0.4 * 0.6**3, rel=1e-12)


def test_paired_test_sees_a_shift_through_the_drift() -> None:
    """The machine's load moves both sides of a round together: pairs cancel it."""
    drift = [1.0, 1.6, 0.8, 1.3, 2.0]
    a = [10 * d for d in drift]
    b = [
        10.5 * d * (1 + e)
        for d, e in zip(drift, [0.003, -0.002, 0.001, -0.003, 0.002], strict=True)
    ]
    test = paired_test(a, b)
    assert test.ratio == pytest.approx(1.05, rel=0.01) and test.shift == 1 and test.p_value < 1e-4
    assert mann_whitney_u(a, b).p_value > 0.5  # unpaired, the drift hides it
    assert paired_test(a, list(a)).p_value == 1.0
    with pytest.raises(ValueError):
        paired_test([1.0], [1.0])


# -- the factor on a rerun's rounds --------------------------------------------------------------

COLS = Columns(("case",), ("p50_us", "hits"), ("p50_us",), (), ("p50_us",))


def _rounds(per_round: list[dict[str, tuple[float, float]]]) -> tuple[list, list]:
    """Records of A and B, one per round: ``{case: (a, b)}`` p50 values of that round."""
    side = [[], []]
    for values in per_round:
        for i in (0, 1):
            rows = [{"case": c, "p50_us": v[i], "hits": 1} for c, v in values.items()]
            side[i].append(RunRecord("alloc_host", "x", COLS, rows, {}, ["case", "p50_us", "hits"]))
    return side[0], side[1]


def _judge(ratios: dict[str, list[float]], th: Thresholds | None = None):
    drift = [1.0, 1.4, 0.9, 1.7, 1.2, 0.8]
    per_round = [
        {case: (10.0 * d, 10.0 * d * rs[r]) for case, rs in ratios.items()}
        for r, d in enumerate(drift[: len(next(iter(ratios.values())))])
    ]
    ra, rb = _rounds(per_round)
    rerun = Rerun(len(ra), (), None, 0)
    d = judge_rounds("A", "B", ra, rb, rerun, [], th or Thresholds(), 0.05)
    return {c.row["case"]: c for c in d.changes if c.metric == "p50_us"}, d


def test_rounds_judged_by_factor_and_significance() -> None:
    steady5 = [1.05, 1.052, 1.049, 1.051, 1.048]
    steady30 = [1.30, 1.31, 1.29, 1.30, 1.32]
    noisy = [1.9, 0.7, 1.7, 0.8, 1.6]
    assert paired_test([1.0] * 5, steady5).p_value < 1e-4  # significant
    assert paired_test([1.0] * 5, noisy).ratio > 1.1  # beyond the factor
    assert paired_test([1.0] * 5, noisy).p_value > 0.05  # and not significant
    found, d = _judge({"steady5": steady5, "steady30": steady30, "noisy": noisy})
    assert found["steady5"].verdict == SAME and found["steady5"].rule is None
    assert found["steady30"].verdict == WORSE and found["steady30"].rule == PAIRED
    assert found["noisy"].verdict == NOISE and found["noisy"].rule == PAIRED
    assert found["steady30"].ratio == pytest.approx(paired_test([1.0] * 5, steady30).ratio)
    assert found["steady30"].rounds == pytest.approx(tuple(steady30))
    assert d.rerun is not None and d.rerun.tests == 3 and d.tested_rows == 3
    assert {c.verdict for c in d.changes if c.metric == "hits"} == {SAME}  # deterministic
    # at factor 1.01 the steady 5 % is a regression too: the factor held it back
    found, _ = _judge({"steady5": steady5}, Thresholds.parse([], factor=1.01))
    assert found["steady5"].verdict == WORSE
    found, _ = _judge({"faster": [1 / r for r in steady30]})
    assert found["faster"].verdict == BETTER


def test_many_rows_of_rounds_find_nothing_by_chance() -> None:
    """60 rows of identical code (5 % noise a round, no shift) at factor 1 (any significant
    move counts): a few rows pass a plain p < 0.05 by chance; after Benjamini-Hochberg over
    the 60 tests none does."""
    rng = random.Random(7)
    ratios = {f"r{i}": [math.exp(rng.gauss(0, 0.05)) for _ in range(5)] for i in range(60)}
    raw = [paired_test([1.0] * 5, rs).p_value for rs in ratios.values()]
    assert sum(p < 0.05 for p in raw) >= 1
    found, d = _judge(ratios, Thresholds.parse([], factor=1.0))
    assert d.rerun.tests == 60
    assert not [c for c in found.values() if c.verdict in (WORSE, BETTER)]
