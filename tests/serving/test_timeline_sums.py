"""The timeline's buckets summed a batch at a time (runs of one bucket at once, edge-crossing
iterations split after) against the same iterations added one at a time, where every
iteration takes the one-iteration path; and against sums written out by hand."""

import numpy as np
import pytest

from cpkv.serving.cost.report import FIELDS
from cpkv.serving.record.timeline import TimelineSums


def _columns(rng, n):
    return [rng.random(n) * 100 for _ in range(FIELDS - 1)] + [3.0]


@pytest.mark.parametrize("ordered", [True, False])
def test_a_batch_is_its_iterations_one_by_one(ordered) -> None:
    rng = np.random.default_rng(11)
    for _ in range(100):
        n, points = int(rng.integers(1, 300)), int(rng.integers(1, 25))
        t0 = rng.random(n) * 1e6
        if ordered:
            t0.sort()
        dt = rng.random(n) * rng.choice([10.0, 1e4, 2e5])
        series = tuple(rng.integers(0, 100, n) for _ in range(4))
        columns = _columns(rng, n)
        batch = TimelineSums(1.1e6, points)
        batch.add(t0, dt, series, [c if isinstance(c, float) else c.copy() for c in columns])
        single = TimelineSums(1.1e6, points)
        for i in range(n):
            one = [c if isinstance(c, float) else c[i : i + 1] for c in columns]
            single.add(t0[i : i + 1], dt[i : i + 1], tuple(s[i : i + 1] for s in series), one)
        assert np.allclose(batch.kv, single.kv, rtol=1e-9, atol=1e-6)
        assert np.allclose(batch.parts, single.parts, rtol=1e-9, atol=1e-6)
        assert batch.peak.tolist() == single.peak.tolist()


def test_a_crossing_iteration_is_split_by_the_time_in_each_bucket() -> None:
    # buckets of 100 µs; iterations [10, 30) in bucket 0, [90, 140) across 0 and 1,
    # [150, 160) in bucket 1: used 2, 4, 6; the time column their durations
    sums = TimelineSums(300.0, 3)
    t0, dt = np.array([10.0, 90.0, 150.0]), np.array([20.0, 50.0, 10.0])
    used = np.array([2, 4, 6])
    zeros = np.zeros(3, dtype=np.int64)
    columns = [dt.copy()] + [0.0] * (FIELDS - 1)
    sums.add(t0, dt, (used, zeros, zeros, zeros), columns)
    assert sums.kv[:, 0].tolist() == pytest.approx([2 * 20 + 4 * 10, 4 * 40 + 6 * 10, 0.0])
    assert sums.parts[:, 0].tolist() == pytest.approx([20 + 10, 40 + 10, 0.0])
    assert sums.peak.tolist() == [4, 6, 0]
