"""The paired test of ``cpkv diff --rerun``: one statistic of one row, A and B run in rounds.

Round r ran A, then B, on the same machine a moment apart, so whatever load the machine had
then weighs on both: the round's ratio ``B_r / A_r`` cancels it, as pyperf compares
interleaved runs. The change is the geometric mean of those ratios (the ratio of the
geometric means of A and B); it is significant when the logarithms of the ratios differ
from 0 by a two-sided paired Student t-test: ``t = mean(d) / (sd(d) / sqrt(n))`` with
``d_r = log(B_r / A_r)`` and ``n - 1`` degrees of freedom. A round whose value is not
positive (a timing of 0) leaves logarithms out: then ``d_r = B_r - A_r`` and the change is
``mean(B) / mean(A)``.

The two-sided p-value of ``t`` is ``I_x(k / 2, 1 / 2)`` with ``x = k / (k + t^2)``, ``k`` the
degrees of freedom and ``I`` the regularized incomplete beta function (a continued
fraction, as in Numerical Recipes' ``betacf``): no SciPy needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIN_ROUNDS = 3
"""Fewer rounds than this: a paired test cannot tell noise from a change."""


@dataclass(frozen=True)
class PairedTest:
    """``ratio``: the change B/A; ``t``, ``p_value``: two-sided, ``n - 1`` degrees of
    freedom; ``shift``: +1 when B tends to be larger, -1 smaller, 0 neither; ``ratios``:
    each round's B/A."""

    n: int
    ratio: float
    t: float
    p_value: float
    shift: int
    ratios: tuple[float, ...]


def paired_test(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    """The paired test of rounds ``a`` and ``b`` (one value each per round; see the module
    docstring). ValueError unless both hold the same number of rounds, at least 2."""
    n = len(a)
    if n != len(b) or n < 2:
        raise ValueError(f"paired_test needs two equal sequences of >= 2 rounds, got {n}, {len(b)}")
    positive = all(v > 0 for v in (*a, *b))
    if positive:
        d = [math.log(y / x) for x, y in zip(a, b, strict=True)]
        ratio = math.exp(sum(d) / n)
    else:
        d = [y - x for x, y in zip(a, b, strict=True)]
        mean_a = sum(a) / n
        ratio = sum(b) / n / mean_a if mean_a else (1.0 if sum(b) == 0 else math.inf)
    ratios = tuple(y / x if x else math.inf for x, y in zip(a, b, strict=True))
    mean = sum(d) / n
    var = sum((v - mean) ** 2 for v in d) / (n - 1)
    shift = (mean > 0) - (mean < 0)
    if var <= 0 or not math.isfinite(var):
        # every round moved by exactly the same amount: no noise to weigh it against
        p = 1.0 if mean == 0 else 0.0
        return PairedTest(n, ratio, 0.0 if mean == 0 else math.copysign(math.inf, mean), p,
                          shift, ratios)  # fmt: skip
    t = mean / math.sqrt(var / n)
    return PairedTest(n, ratio, t, t_two_sided(t, n - 1), shift, ratios)


def t_two_sided(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if math.isinf(t):
        return 0.0
    return min(1.0, betainc(df / 2, 0.5, df / (df + t * t)))


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``, for 0 <= x <= 1."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1 - x) / b


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of ``I_x(a, b)`` by the modified Lentz method."""
    tiny, eps = 1e-300, 3e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h
