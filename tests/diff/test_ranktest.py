"""The Mann–Whitney U test and the Benjamini–Hochberg adjustment, against values worked by hand
and against a brute-force count of pairs."""

from __future__ import annotations

import math
import random

import pytest

from cpkv.diff.ranktest import benjamini_hochberg, mann_whitney_u


def test_separated_samples_by_hand() -> None:
    # x = 1,2,3 and y = 4,5,6: x holds ranks 1,2,3, R_x = 6, U = 6 - 3*4/2 = 0.
    # mean U = 3*3/2 = 4.5; no ties: var = 3*3*(6+1)/12 = 5.25;
    # z = (|0 - 4.5| - 0.5) / sqrt(5.25) = 4 / 2.29129 = 1.74574; p = erfc(z / sqrt 2) = 0.08086
    t = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert t.u == 0
    assert t.z == pytest.approx(4 / math.sqrt(5.25))
    assert t.p_value == pytest.approx(0.08086, abs=1e-5)
    assert t.shift == 1  # y (B) tends to be larger
    assert mann_whitney_u([4, 5, 6], [1, 2, 3]).shift == -1


def test_ties_by_hand() -> None:
    # x = 1,2,2 and y = 2,3,4, pooled: 1 | 2 2 2 | 3 | 4; the three 2s share ranks 2,3,4 -> 3.
    # R_x = 1 + 3 + 3 = 7, U = 7 - 6 = 1; mean 4.5; one tie group of t=3: t^3 - t = 24;
    # var = 3*3/12 * ((6+1) - 24/(6*5)) = 0.75 * 6.2 = 4.65; z = (3.5 - 0.5)/sqrt(4.65) = 1.39122;
    # p = erfc(1.39122 / sqrt 2) = erfc(0.98374) = 0.16416
    t = mann_whitney_u([1, 2, 2], [2, 3, 4])
    assert t.u == 1
    assert t.z == pytest.approx(3 / math.sqrt(4.65))
    assert t.p_value == pytest.approx(0.16416, abs=1e-5)


def test_identical_values_cannot_differ() -> None:
    t = mann_whitney_u([5, 5], [5, 5, 5])
    assert (t.p_value, t.shift) == (1.0, 0)
    with pytest.raises(ValueError):
        mann_whitney_u([], [1.0])


def test_u_equals_the_count_of_pairs() -> None:
    """U is the number of pairs (x, y) with x > y, ties counting one half (brute force)."""
    rng = random.Random(7)
    for _ in range(50):
        x = [rng.choice(range(12)) for _ in range(rng.randint(1, 15))]
        y = [rng.choice(range(12)) for _ in range(rng.randint(1, 15))]
        pairs = sum((a > b) + 0.5 * (a == b) for a in x for b in y)
        t = mann_whitney_u(x, y)
        assert t.u == pytest.approx(pairs)
        assert 0.0 <= t.p_value <= 1.0
        # the test is symmetric: swapping the samples keeps p and flips the shift
        s = mann_whitney_u(y, x)
        assert s.p_value == pytest.approx(t.p_value) and s.shift == -t.shift


def test_benjamini_hochberg_by_hand() -> None:
    # p = .01 .04 .03 .5, m = 4; sorted .01 .03 .04 .5 -> p*m/rank = .04 .06 .0533 .5;
    # running minimum from the largest rank down: .04 .0533 .0533 .5; back in the given order:
    assert benjamini_hochberg([0.01, 0.04, 0.03, 0.5]) == pytest.approx(
        [0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.5]
    )
    assert benjamini_hochberg([]) == []
    assert benjamini_hochberg([0.3]) == [0.3]
    assert benjamini_hochberg([0.9, 0.95]) == [0.95, 0.95]
