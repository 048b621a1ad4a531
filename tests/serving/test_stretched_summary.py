"""A run's summary from its closed-form stretches' segments (each expanded into its
iterations: their durations, their blocks by the repeating growth counts) against the same
run stepped iteration by iteration, whose log has one segment per iteration."""

import numpy as np
import pytest

from cpkv.serving.cost.model import CostModel
from cpkv.serving.cost.spec import CostSpec
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.engine.simulate import simulate
from cpkv.serving.input.workload import ServingRequest


def _requests(n: int, seed: int) -> list[ServingRequest]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(60.0, n))
    return [
        ServingRequest(
            f"r{k}", float(arrivals[k]), int(rng.integers(64, 1500)), int(rng.integers(8, 300))
        )
        for k in range(n)
    ]


COSTS = {
    "linear": CostModel(fixed_us=2000.0),
    "roofline": CostSpec(model="llama-3-8b", gpu="h100-sxm").build(),
}


@pytest.mark.parametrize("cost", list(COSTS))
@pytest.mark.parametrize("capacity", [20_000, 700])  # roomy; tight (growth preempts)
def test_a_stretched_runs_summary_is_the_stepped_runs(cost, capacity) -> None:
    settings = EngineSettings(capacity_blocks=capacity, cost=COSTS[cost])
    requests = _requests(300, 3)
    stretched = simulate(requests, settings)
    stepped = simulate(requests, settings, stretches=False)
    assert stretched.end_us == pytest.approx(stepped.end_us, rel=1e-12)
    points = 37
    a = stretched.samples.summary(stretched.end_us, points)
    b = stepped.samples.summary(stepped.end_us, points)
    assert a.integrals.iterations == b.integrals.iterations > 1000
    for name in ("used_sum", "held_sum", "used_peak"):
        assert getattr(a.integrals, name) == getattr(b.integrals, name), name
    for name in ("used_block_us", "held_block_us"):
        assert getattr(a.integrals, name) == pytest.approx(getattr(b.integrals, name), rel=1e-9)
    assert np.allclose(a.time_totals.sums, b.time_totals.sums, rtol=1e-9, atol=1e-6)
    assert np.allclose(a.timeline.kv, b.timeline.kv, rtol=1e-9, atol=1e-3)
    assert np.allclose(a.timeline.parts, b.timeline.parts, rtol=1e-9, atol=1e-3)
    assert a.timeline.peak.tolist() == b.timeline.peak.tolist()
