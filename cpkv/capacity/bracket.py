"""The highest load that still meets a target: bracketing, then bisection (pure, no I/O).

A :class:`LoadSearch` asks for loads one at a time (:meth:`~LoadSearch.next_load`) and is told
whether each met the target (:meth:`~LoadSearch.record`). It assumes that meeting the target
is monotone in the load (met below some threshold, missed above it):

1. **bracketing**: the first load is ``start``; while every load met, the next is the last one
   times ``growth``; while every load missed, the last one divided by ``growth``. It ends with
   ``low`` (the highest load that met) and ``high`` (the lowest load that missed), ``low < high``;
2. **bisection**: the next load is the geometric midpoint ``sqrt(low * high)`` (the bracket's
   ratio halves in log space), rounded to :data:`SIGNIFICANT_DIGITS` significant digits, until
   ``high <= low * (1 + tolerance)``.

The answer is ``low``: a load that met, with a load that missed at most ``tolerance`` above it,
so the threshold lies in ``[low, low * (1 + tolerance)]``. A search also ends after
``max_points`` loads: ``above_range`` when every load met (the capacity is above the highest
load tried), ``below_range`` when every load missed (even the lowest load tried misses: the
SLO is out of reach at any load), ``point_limit`` when the bisection had not reached the
tolerance yet (the bracket is reported).

Loads stay within ``[floor, ceiling]`` (the lowest and highest load a run can take: the load
key's bounds, the simulation clock's range): bracketing that would step past one tries the
bound itself, and ends there (``below_range`` or ``above_range``) once it has been tried.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SIGNIFICANT_DIGITS = 5
"""Loads are rounded to this many significant digits (readable names, exact YAML round trips)."""
MIN_TOLERANCE = 0.001
"""The smallest relative tolerance: a midpoint of a tighter bracket could round onto an end."""

FOUND, ABOVE_RANGE, BELOW_RANGE, POINT_LIMIT = "found", "above_range", "below_range", "point_limit"


def round_load(load: float) -> float:
    """``load`` rounded to :data:`SIGNIFICANT_DIGITS` significant digits."""
    if load <= 0 or not math.isfinite(load):
        raise ValueError(f"a load must be a positive finite number, got {load}")
    return float(f"{load:.{SIGNIFICANT_DIGITS}g}")


@dataclass
class LoadSearch:
    """One search's state (see the module docstring)."""

    start: float
    tolerance: float
    growth: float = 2.0
    max_points: int = 30
    tried: list[tuple[float, bool]] = field(default_factory=list)
    low: float | None = None
    high: float | None = None
    floor: float | None = None  # the lowest load allowed (None: any above 0)
    ceiling: float | None = None  # the highest (None: any finite one)

    def __post_init__(self) -> None:
        if not self.tolerance >= MIN_TOLERANCE:
            raise ValueError(f"tolerance must be >= {MIN_TOLERANCE}, got {self.tolerance}")
        if not self.growth > 1:
            raise ValueError(f"growth must be > 1, got {self.growth}")
        if self.max_points < 1:
            raise ValueError(f"max_points must be >= 1, got {self.max_points}")
        self.start = round_load(self.start)

    def next_load(self) -> float | None:
        """The next load to try, or None when the search is over (see :attr:`outcome`)."""
        if not self.tried:
            return self.start
        if len(self.tried) >= self.max_points or self.converged:
            return None
        if self.low is None:
            return self._down(self.high)  # type: ignore[arg-type]
        if self.high is None:
            return self._up(self.low)
        mid = round_load(math.sqrt(self.low * self.high))
        return (
            mid if self.low < mid < self.high else None
        )  # rounding met an end: as close as it gets

    def _down(self, high: float) -> float | None:
        """The next load below ``high`` while bracketing (the floor at the lowest), or None."""
        raw = high / self.growth
        load = round_load(raw) if raw > 0 else None  # 0: an underflow, no load
        if self.floor is not None:
            least = _at_least(self.floor)
            load = least if load is None or load < least else load
        return load if load is not None and load < high else None

    def _up(self, low: float) -> float | None:
        """The next load above ``low`` while bracketing (the ceiling at the highest), or None."""
        raw = low * self.growth
        load = round_load(raw) if math.isfinite(raw) else None
        if load is not None and not math.isfinite(load):  # rounded up past the largest float
            load = None
        if self.ceiling is not None:
            most = _at_most(self.ceiling)
            load = most if load is None or load > most else load
        return load if load is not None and load > low else None

    def record(self, load: float, met: bool) -> None:
        """The load just tried (the one :meth:`next_load` returned) met the target or not."""
        expected = self.next_load()
        if expected is None or load != expected:
            raise ValueError(f"recorded load {load} is not the one asked for ({expected})")
        self.tried.append((load, met))
        if met:
            self.low = load if self.low is None else max(self.low, load)
        else:
            self.high = load if self.high is None else min(self.high, load)

    @property
    def converged(self) -> bool:
        """A bracket within the tolerance."""
        return (
            self.low is not None
            and self.high is not None
            and self.high <= self.low * (1 + self.tolerance)
        )

    @property
    def done(self) -> bool:
        return self.next_load() is None

    @property
    def outcome(self) -> str | None:
        """None while running; else found, above_range, below_range or point_limit."""
        if not self.done:
            return None
        if self.low is None:
            return BELOW_RANGE
        if self.high is None:
            return ABOVE_RANGE
        if not self.converged and len(self.tried) >= self.max_points:
            return POINT_LIMIT
        return FOUND  # within the tolerance (or a midpoint that rounds onto an end)


def _at_least(bound: float) -> float:
    """The smallest load of :data:`SIGNIFICANT_DIGITS` digits that is >= ``bound``."""
    load = round_load(bound)
    return load if load >= bound else round_load(bound * (1 + 10.0 ** (1 - SIGNIFICANT_DIGITS)))


def _at_most(bound: float) -> float:
    """The largest load of :data:`SIGNIFICANT_DIGITS` digits that is <= ``bound``."""
    load = round_load(bound)
    return load if load <= bound else round_load(bound * (1 - 10.0 ** (1 - SIGNIFICANT_DIGITS)))
