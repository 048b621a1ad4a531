"""A whole run kept in memory: :func:`simulate` (small runs, tests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cpkv.serving.engine.engine import Engine, EngineResult
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.input.arrivals import arrival_order
from cpkv.serving.model.request import Req
from cpkv.serving.record.iteration_log import IterationLog


class KeepRequests:
    """A sink that keeps every request (``EngineResult.requests``)."""

    def __init__(self) -> None:
        self.requests: list[Req] = []

    def done(self, r: Req) -> None:
        self.requests.append(r)

    def in_input_order(self) -> list[Req]:
        return sorted(self.requests, key=lambda r: r.index)


def simulate(
    requests: Sequence[Any],
    settings: EngineSettings,
    cache: Any = None,
    events: bool = False,
    stretches: bool = True,
) -> EngineResult:
    """Run an engine on ``requests`` (:class:`~cpkv.serving.input.workload.ServingRequest`,
    input order; they arrive at their ``arrival_ms``), keeping every request and every
    iteration's sample in the result; ``cache`` is a cold
    :class:`~cpkv.trace.prefix_cache.TieredPrefixCache` (or None); ``events`` records every
    growth/preemption event and a per-iteration log (every iteration then runs in full);
    ``stretches=False`` runs every iteration in full too (the closed-form stretches' reference)."""
    samples = IterationLog(
        settings.capacity_blocks, settings.block_size, keep=True, cost=settings.cost
    )
    engine = Engine(
        settings, cache, events, sink=KeepRequests(), samples=samples,
        arrivals=arrival_order(requests),
    )  # fmt: skip
    engine.fast = engine.fast and stretches
    result = engine.run()
    result.integrals = samples.summary(result.end_us, 1).integrals
    return result
