"""The one timing helper: what is inside the clock, the statistics, the sampling protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cpkv.core.timing as timing


def test_timed_syncs_right_before_the_clock_starts_and_stops(monkeypatch) -> None:
    """Device work queued before the call stays outside; the call's own work is inside."""
    events: list[str] = []
    ticks = iter([1_000, 5_000])

    def clock() -> int:
        events.append("clock")
        return next(ticks)

    monkeypatch.setattr(timing.time, "perf_counter_ns", clock)
    result, us = timing.timed(lambda: events.append("call") or 42, lambda: events.append("sync"))
    assert events == ["sync", "clock", "call", "sync", "clock"]
    assert result == 42 and us == 4.0


def test_timed_without_sync_times_only_the_call(monkeypatch) -> None:
    events: list[str] = []
    ticks = iter([10, 2_010])
    monkeypatch.setattr(
        timing.time, "perf_counter_ns", lambda: events.append("clock") or next(ticks)
    )
    assert timing.timed(lambda: events.append("call")) == (None, 2.0)
    assert events == ["clock", "call", "clock"]


def test_cuda_sync_is_only_for_cuda_devices() -> None:
    assert timing.cuda_sync(torch.device("cpu")) is None
    assert timing.cuda_sync("cpu") is None
    assert callable(timing.cuda_sync(torch.device("cuda", 0)))  # built lazily, not called


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=60), st.floats(0, 100))
def test_percentile_is_numpys_linear_method(samples, q) -> None:
    assert timing.percentile(samples, q) == pytest.approx(np.percentile(samples, q), abs=1e-6)


def test_summarize_by_hand() -> None:
    s = timing.summarize([4.0, 1.0, 3.0, 2.0])
    assert (s.n, s.mean_us, s.min_us, s.max_us) == (4, 2.5, 1.0, 4.0)
    assert s.p50_us == 2.5  # halfway between 2 and 3
    assert s.stdev_us == pytest.approx((5 / 3) ** 0.5)  # sample stdev of 1..4
    assert timing.summarize([]).n == 0 and timing.summarize([7.0]).stdev_us == 0.0


def test_sample_sets_up_untimed_drops_warmup_and_observes_kept_samples(monkeypatch) -> None:
    clock = iter(range(0, 10_000_000, 1_000))  # every clock read is 1 us after the last
    monkeypatch.setattr(timing.time, "perf_counter_ns", lambda: next(clock))
    built, seen = [], []

    def setup() -> int:
        built.append(len(built))
        return built[-1]

    samples = timing.sample(
        setup,
        lambda state: state * 10,
        repeat=3,
        warmup=2,
        observe=lambda s, r: seen.append((s, r)),
    )
    assert built == [0, 1, 2, 3, 4]  # a fresh state for every call, warm-up included
    assert seen == [(2, 20), (3, 30), (4, 40)]  # only the kept samples are observed
    assert samples == [1.0, 1.0, 1.0]  # setup and observe are outside the clock


def test_stopwatch_reads_wall_and_cpu_clocks_around_the_block(monkeypatch) -> None:
    wall, cpu = iter([10.0, 10.5]), iter([3.0, 3.25])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(wall))
    monkeypatch.setattr(timing.time, "process_time", lambda: next(cpu))
    with timing.Stopwatch() as sw:
        pass
    assert sw.elapsed == timing.Elapsed(wall_s=0.5, cpu_s=0.25)
