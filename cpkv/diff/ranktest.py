"""The Mann–Whitney U test (two-sided), with the normal approximation and the tie correction.

``cpkv diff`` asks it whether two rows' raw timing samples come from the same distribution
before it calls a timing change significant (the way pyperf and asv do): a burst of noise
that moves a few samples (and with them a p99 or a mean) does not move the ranks of the rest.

For samples ``x`` (size m) and ``y`` (size n), pooled and ranked (ties get their mean rank),
``U = R_x - m (m + 1) / 2`` where ``R_x`` is the rank sum of ``x``. Under the null hypothesis
``U`` has mean ``m n / 2`` and variance ``m n / 12 * ((N + 1) - sum(t^3 - t) / (N (N - 1)))``
(``N = m + n``, ``t`` the size of each group of tied values). The two-sided p-value is
``erfc(|z| / sqrt 2)`` with ``z = (|U - m n / 2| - 1/2) / sd`` (the 1/2 is the continuity
correction; ``z`` is never below 0). The approximation is good from about 8 samples a side;
``cpkv diff`` needs at least :data:`MIN_SAMPLES` on each side to use the test at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIN_SAMPLES = 5
"""Fewer samples than this on either side: the test is not used (too little to rank)."""


@dataclass(frozen=True)
class RankTest:
    """``u``: the U statistic of the first sample (pairs where it is the larger, ties
    counting 1/2); ``z`` and ``p_value``: two-sided; ``shift``: +1 when the second sample
    tends to be larger (``u < m n / 2``), -1 when smaller, 0 when neither."""

    u: float
    z: float
    p_value: float
    shift: int = 0


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> RankTest:
    """Two-sided Mann–Whitney U test of ``x`` against ``y`` (see the module docstring).

    ValueError when either side is empty. When every value is tied the variance is 0 and the
    samples cannot differ: ``p_value`` 1.
    """
    m, n = len(x), len(y)
    if not m or not n:
        raise ValueError("mann_whitney_u needs at least one value on each side")
    pooled = sorted([(float(v), 0) for v in x] + [(float(v), 1) for v in y])
    total = m + n
    rank_sum_x = 0.0
    tie_term = 0.0
    i = 0
    while i < total:
        j = i
        while j + 1 < total and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        mean_rank = (i + j) / 2 + 1  # ranks i+1 .. j+1, averaged
        tied = j - i + 1
        tie_term += tied**3 - tied
        rank_sum_x += mean_rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        i = j + 1
    u = rank_sum_x - m * (m + 1) / 2
    mean_u = m * n / 2
    variance = m * n / 12 * ((total + 1) - tie_term / (total * (total - 1))) if total > 1 else 0.0
    shift = (u < mean_u) - (u > mean_u)
    if variance <= 0:
        return RankTest(u, 0.0, 1.0, shift)
    z = max(0.0, abs(u - mean_u) - 0.5) / math.sqrt(variance)
    return RankTest(u, z, math.erfc(z / math.sqrt(2)), shift)


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (q-values), in the order given.

    ``q_(i) = min over j >= i of (m / j) p_(j)`` for the p-values sorted ascending (capped at
    1); a test is significant at false discovery rate ``alpha`` when its q < ``alpha``. When
    no difference is real, the chance that any q < ``alpha`` is at most ``alpha``, however
    many rows a diff tests.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, p_values[i] * m / rank)
        adjusted[i] = min(1.0, running)
    return adjusted
