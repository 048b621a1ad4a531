"""Fit the all-reduce's latency and two bandwidth regimes (:mod:`cpkv.serving.cost.allreduce`)
to measured all-reduce tables (Vidur's ``network_<gpu>_dgx/all_reduce.csv``).

For a chosen ``switch_bytes`` the time is linear in the latency and in the inverses of the two
efficiencies; its three columns are :func:`~cpkv.serving.cost.allreduce.allreduce_us` itself,
each with one of them 1 and the others 0 (an infinite efficiency sends at no cost), so the
fit and the model share the formula. Each switch of :func:`switch_candidates` is solved by
weighted least squares on relative errors ``predicted / measured - 1``, within the bounds of
the calibration keys (latency >= 0, efficiencies in [:data:`~cpkv.serving.cost.calibration.
MIN_EFFICIENCY`, 1]); the switch with the least weighted error wins, 0 (one regime) included.

Weights: the tables space their sizes evenly in bytes (8 KiB apart up to 1 MiB, then 32 KiB
and 128 KiB apart up to 64 MiB), so most points are large messages; each octave of sizes
(``2^k`` to ``2^(k+1)`` bytes) of a table weighs the same, and each table the same, so the
few kilobyte-sized measurements (a decode step's messages) count as much as the megabytes (a
prefill's). Numpy is imported here only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cpkv.serving.cost.allreduce import AllReduceRegimes, allreduce_us
from cpkv.serving.cost.calibration import MIN_EFFICIENCY
from cpkv.serving.cost.fitting.profiles import AllReduceTimes

SWITCH_CANDIDATES = 64
"""Switch sizes tried between a table's smallest and largest size (geometric), besides 0."""
_UNIT = (
    AllReduceRegimes(1.0, math.inf, 0, math.inf),  # the latency's column
    AllReduceRegimes(0.0, 1.0, 0, math.inf),  # the low-latency regime's bytes
    AllReduceRegimes(0.0, math.inf, 0, 1.0),  # the bandwidth regime's bytes
)
_BOUNDS = ((0.0, math.inf), (1.0, 1.0 / MIN_EFFICIENCY), (1.0, 1.0 / MIN_EFFICIENCY))
"""Of the latency and of each inverse efficiency."""


def switch_candidates(tables: Sequence[tuple[int, AllReduceTimes]]) -> list[int]:
    """0 and :data:`SWITCH_CANDIDATES` sizes, whole KiB, spaced geometrically over the tables."""
    import numpy as np

    low = min(t.sizes[0] for _, t in tables)
    high = max(t.sizes[-1] for _, t in tables)
    grid = np.geomspace(max(low, 1024), max(high, 1024), SWITCH_CANDIDATES)
    return [0, *sorted({int(round(x / 1024)) * 1024 for x in grid.tolist()})]


def octave_weights(np: Any, sizes: Any) -> Any:
    """Each point's weight: 1 / the number of the table's points in its octave of sizes."""
    octave = np.floor(np.log2(np.asarray(sizes, dtype=float))).astype(int)
    _, where, counts = np.unique(octave, return_inverse=True, return_counts=True)
    return 1.0 / counts[where.reshape(-1)]


def predict_allreduce_us(
    workers: int, times: AllReduceTimes, link_gb_per_s: float, regimes: AllReduceRegimes
) -> Any:
    """The model's time at each size of ``times`` (numpy)."""
    import numpy as np

    sizes = np.asarray(times.sizes, dtype=float)
    return allreduce_us(sizes, workers, link_gb_per_s, regimes, np.minimum)


def fit_allreduce(
    tables: Sequence[tuple[int, AllReduceTimes]],
    link_gb_per_s: float,
    switches: Sequence[int] | None = None,
) -> AllReduceRegimes:
    """The regimes that fit the worker counts' tables (see the module docstring), the switch
    one of ``switches`` (default :func:`switch_candidates`; ``[0]``: one regime)."""
    import numpy as np

    measured = np.concatenate([np.asarray(t.time_us) for _, t in tables])
    weights = np.concatenate([octave_weights(np, t.sizes) / len(tables) for _, t in tables])
    best: tuple[float, AllReduceRegimes] | None = None
    for switch in switch_candidates(tables) if switches is None else switches:
        columns = np.stack(
            [
                np.concatenate(
                    [
                        predict_allreduce_us(n, t, link_gb_per_s, _unit(unit, switch))
                        for n, t in tables
                    ]
                )
                for unit in _UNIT
            ],
            axis=1,
        )
        latency, small, large = _bounded_lstsq(np, columns, measured, weights)
        if switch == 0:  # no byte below the switch: the small regime is the large one
            small = large
        regimes = AllReduceRegimes(
            round(latency, 3), _efficiency(small), switch, _efficiency(large)
        )
        predicted = np.concatenate(
            [predict_allreduce_us(n, t, link_gb_per_s, regimes) for n, t in tables]
        )
        score = float(np.sum(weights * (predicted / measured - 1.0) ** 2))
        if best is None or score < best[0]:
            best = (score, regimes)
    assert best is not None
    return best[1]


def _unit(unit: AllReduceRegimes, switch: int) -> AllReduceRegimes:
    return AllReduceRegimes(unit.latency_us, unit.small_bw_eff, switch, unit.bw_eff)


def _efficiency(inverse: float) -> float:
    return round(1.0 / inverse, 4)


def _bounded_lstsq(np: Any, x: Any, measured: Any, weights: Any) -> tuple[float, float, float]:
    """Weighted least squares of ``x @ p / measured - 1`` with each ``p[i]`` in
    :data:`_BOUNDS`: every choice of free and bound-held coefficients, the best feasible."""
    import itertools

    a = x / measured[:, None] * np.sqrt(weights)[:, None]
    b = np.sqrt(weights)
    best: tuple[float, Any] | None = None
    choices = [(None, low, high) if math.isfinite(high) else (None, low) for low, high in _BOUNDS]
    for held in itertools.product(*choices):
        free = [i for i, h in enumerate(held) if h is None]
        p = np.array([0.0 if h is None else h for h in held])
        rest = b - a @ p
        if free:
            sol, *_ = np.linalg.lstsq(a[:, free], rest, rcond=None)
            p[free] = sol
        if any(not (low - 1e-12 <= p[i] <= high + 1e-12) for i, (low, high) in enumerate(_BOUNDS)):
            continue
        score = float(np.sum((a @ p - b) ** 2))
        if best is None or score < best[0]:
            best = (score, p)
    assert best is not None  # holding every coefficient at a bound is feasible
    latency, small, large = (float(v) for v in best[1])
    return latency, small, large
