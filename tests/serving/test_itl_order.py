"""The ITL statistics of weighted records equal numpy's over the gaps written out one by one:
random points and lines (steep and flat, rising and falling), gaps of several iterations
withdrawn by records of weight -1, one-iteration gaps withdrawn by iteration range, values
spread over many orders of magnitude or all equal; with the bins coarse enough that every
order statistic takes refining passes, and fine enough that none does; spilled to disk and
kept in memory; several instances pooled."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cpkv.serving.record import itl as itl_module
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.serving.record.itl import itl_stats


def new_log(tmp_path=None) -> IterationLog:
    return IterationLog(10, 16, keep=tmp_path is None, spill_dir=tmp_path)


def fill(log: IterationLog, seed: int, spread: float = 1.0) -> list[float]:
    """Random records into ``log``'s gaps; the gaps one by one (what they stand for)."""
    rng = random.Random(seed)
    gaps, out, iteration = log.gaps, [], 0
    per_iteration: dict[int, list[float]] = {}
    for _ in range(rng.randint(1, 400)):
        kind = rng.random()
        weight = rng.randint(1, 6)
        if kind < 0.4:  # one iteration
            value = rng.uniform(1.0, 50.0) * spread ** rng.random()
            gaps.point(iteration, value, weight)
            per_iteration.setdefault(iteration, []).extend([value] * weight)
            iteration += 1
        elif kind < 0.8:  # a stretch
            a, b = rng.uniform(5.0, 50.0), rng.choice([0.0, 1e-9, 1e-3, 0.5, -0.01])
            first, steps = rng.choice([0, 0, 2]), rng.randint(1, 300)
            gaps.line(iteration, a, b, first, first + steps, weight)
            for s in range(steps):
                per_iteration.setdefault(iteration + s, []).extend(
                    [(a + b * first) + b * s] * weight
                )
            iteration += steps
        else:  # several iterations; sometimes withdrawn again
            value = rng.uniform(10.0, 5000.0) * spread ** rng.random()
            gaps.point(-1, value, 1)
            if rng.random() < 0.3:
                gaps.point(-1, value, -1)
            else:
                out.append(value)
    for _ in range(rng.randint(0, 5)):  # requests that did not finish: one gap an iteration
        first = rng.randrange(max(1, iteration))
        last = min(iteration - 1, first + rng.randint(0, 20))
        covered = [i for i in range(first, last + 1) if per_iteration.get(i)]
        if covered and len(covered) == last - first + 1:
            gaps.withdraw(first, last)
            for i in covered:
                per_iteration[i].remove(per_iteration[i][0])
    for values in per_iteration.values():
        out.extend(values)
    return out


def expected(values: list[float]) -> dict[str, float]:
    v = np.array(values) / 1000.0
    return {"mean": v.mean(), "p50": np.percentile(v, 50), "p90": np.percentile(v, 90),
            "p99": np.percentile(v, 99), "max": v.max(), "gaps": len(v)}  # fmt: skip


def check(logs: list[IterationLog], values: list[float]) -> None:
    got, want = itl_stats(logs), expected(values)
    assert got.gaps == want["gaps"]
    for k in ("mean", "p50", "p90", "p99", "max"):
        assert getattr(got, f"{k}_ms") == pytest.approx(want[k], rel=1e-12, abs=0), k


@pytest.mark.parametrize("seed", range(40))
def test_statistics_of_records_equal_the_gaps_one_by_one(seed):
    log = new_log()
    check([log], fill(log, seed))


@pytest.mark.parametrize("seed", range(10))
def test_refining_passes_and_collecting_agree(monkeypatch, seed):
    """Bins so coarse and a collecting limit so low that every statistic is found by
    refining down to single bit patterns; and the default (collected in one pass)."""
    log = new_log()
    values = fill(log, 100 + seed)
    check([log], values)
    monkeypatch.setattr(itl_module, "BINS", 4)
    monkeypatch.setattr(itl_module, "COLLECT", 1)
    check([log], values)
    monkeypatch.setattr(itl_module, "REFINE_BITS", 3)
    check([log], values)


def test_values_over_many_orders_of_magnitude_and_all_equal(tmp_path):
    log = new_log(tmp_path)
    values = fill(log, 7, spread=1e9)
    check([log], values)
    flat = new_log(tmp_path)
    flat.gaps.line(0, 25.0, 0.0, 0, 1000, 3)
    flat.gaps.point(-1, 25.0, 1)
    check([flat], [25.0] * 3001)


def test_instances_pool_their_gaps(tmp_path):
    logs, values = [], []
    for seed in range(3):
        log = new_log(tmp_path if seed % 2 else None)
        values += fill(log, 200 + seed)
        logs.append(log)
    check(logs, values)


def test_no_gap_and_one_gap():
    assert itl_stats([new_log()]).gaps == 0
    log = new_log()
    log.gaps.point(3, 1500.0, 1)
    one = itl_stats([log])
    assert (one.gaps, one.mean_ms, one.p50_ms, one.p99_ms, one.max_ms) == (1, 1.5, 1.5, 1.5, 1.5)


def test_a_log_of_many_batches_is_read_from_its_file(tmp_path):
    """More records than one batch holds, spilled: read back in order, every one counted."""
    log = new_log(tmp_path)
    rng = random.Random(3)
    values = []
    for i in range(20_000):
        value = rng.uniform(100.0, 200.0)
        log.gaps.point(i, value, 2)
        values += [value, value]
    assert log.gaps.spilled.file is not None and len(log.gaps.spilled.index) > 1
    check([log], values)


def test_segments_carry_their_one_iteration_gaps():
    """A full iteration's gaps are its duration (end - start), a stretch's its line; the
    iterations count from the log's first segment (a withdrawn range finds them)."""
    log = IterationLog(10, 16, keep=True)
    log.iteration(0.0, 1000.0, 2, 0, 1, 9, 0, 2, 10, 0, 0, 0, 2)  # iteration 0: 2 x 1000
    log.stretch(1000.0, 3, 4003.0, 2, 0, 1, 9, 0, 10, 0, 0, 0, [0], None, 2, 1000.0, 1.0)
    log.iteration(4003.0, 5.0, 1, 0, 1, 9, 0, 1, 10, 0, 0, 0, 0)  # no gap
    log.gaps.withdraw(2, 3)  # one request's gaps at iterations 2 and 3 (the stretch's last two)
    values = [1000.0, 1000.0, 1000.0, 1000.0, 1001.0, 1002.0]
    check([log], values)
