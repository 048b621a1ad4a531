"""The loads a capacity search may try: within its load key's bounds and the clock's range.

A search's load is ``admit.arrivals.rate_rps`` or ``speedup``; the schema bounds both
(:mod:`cpkv.serving.schema`), and a run whose arrivals reach past the simulation clock's
range is refused (:mod:`cpkv.serving.engine.clock`). The arrivals' span scales as one over
the load, so the lowest load a workload can run at is its last arrival at the config's load
(the kind's ``last_arrival``) times that load, over the clock's limit. A search that would go
lower (or higher than the key allows) ends there: ``below_range`` (or ``above_range``), never
a run the clock refuses or a load that underflows to 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpkv.core.kinds import KINDS
from cpkv.core.schema.limits import CLOCK_LIMIT_US

KIND = "admit"


def load_range(load_key: str, config: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """``(floor, ceiling)`` of the load ``load_key`` for the resolved ``config``."""
    floor, ceiling = _key_bounds(load_key)
    clock = _clock_floor(config, load_key)
    if clock is not None:
        floor = clock if floor is None else max(floor, clock)
    return floor, ceiling


def _key_bounds(load_key: str) -> tuple[float | None, float | None]:
    from cpkv.core.schema.keys import leaves

    floor = ceiling = None
    for leaf in leaves(KINDS.get(KIND).config_cls()):
        if leaf.key != load_key:
            continue
        for bound in leaf.ranges:
            if bound.low is not None and bound.low > 0:
                floor = bound.low
            if bound.high is not None:
                ceiling = bound.high
    return floor, ceiling


def _clock_floor(config: Mapping[str, Any], load_key: str) -> float | None:
    """The lowest load at which the workload's last arrival stays within the clock's range
    (None: its arrivals take no time)."""
    from cpkv.core.config import lookup
    from cpkv.core.schema import build

    spec = KINDS.get(KIND)
    last = spec.last_arrival_fn()
    if last is None:
        return None
    last_us = last(build(spec.config_cls(), dict(config)))
    if not last_us > 0:
        return None
    return float(lookup(config, load_key)) * last_us / CLOCK_LIMIT_US
