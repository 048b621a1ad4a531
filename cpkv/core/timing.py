"""The one timing helper every benchmark uses.

Only the call under test is timed, with ``time.perf_counter_ns``; :class:`Stopwatch` times a
whole stage (wall-clock and process CPU time) for the rates of ``cpkv admit``. When a ``sync``
callable is given (``torch.cuda.synchronize`` for CUDA work) it runs right before the
clock starts and right before it stops, so that asynchronous device work is inside
the measurement and nothing queued earlier leaks into it.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

R = TypeVar("R")


def timed(call: Callable[[], R], sync: Callable[[], Any] | None = None) -> tuple[R, float]:
    """Run ``call()`` once; return its result and the elapsed time in microseconds."""
    if sync is not None:
        sync()
    start = time.perf_counter_ns()
    result = call()
    if sync is not None:
        sync()
    return result, (time.perf_counter_ns() - start) / 1000.0


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default 'linear' method); 0.0 when empty."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    if lo == hi:
        return float(ordered[lo])
    return float(ordered[lo] * (hi - rank) + ordered[hi] * (rank - lo))


SAMPLES_KEPT = 200
"""At most this many raw samples per row go into results.json (see :func:`kept_samples`)."""


def kept_samples(samples_us: Sequence[float], limit: int = SAMPLES_KEPT) -> tuple[float, ...]:
    """The raw samples a result row keeps for ``cpkv diff``'s rank test, to the nanosecond.

    Up to ``limit`` samples are kept whole, in the order they were measured. Beyond that,
    ``limit`` evenly spaced order statistics of the sorted samples (the smallest, the largest
    and ``limit - 2`` between): the same distribution, drawn with fewer points, which only
    makes the rank test more cautious (a smaller n needs a larger shift to be significant).
    """
    if len(samples_us) <= limit:
        chosen: Sequence[float] = samples_us
    else:
        ordered = sorted(samples_us)
        last = len(ordered) - 1
        chosen = [ordered[round(i * last / (limit - 1))] for i in range(limit)]
    return tuple(round(float(v), 3) for v in chosen)


@dataclass(frozen=True)
class Stats:
    """Summary of timing samples, in microseconds, and the samples kept (:func:`kept_samples`)."""

    n: int
    mean_us: float
    p25_us: float
    p50_us: float
    p75_us: float
    p95_us: float
    p99_us: float
    min_us: float
    max_us: float
    stdev_us: float
    samples_us: tuple[float, ...] = ()


def summarize(samples_us: Sequence[float]) -> Stats:
    if not samples_us:
        return Stats(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return Stats(
        n=len(samples_us),
        mean_us=float(statistics.fmean(samples_us)),
        p25_us=percentile(samples_us, 25),
        p50_us=percentile(samples_us, 50),
        p75_us=percentile(samples_us, 75),
        p95_us=percentile(samples_us, 95),
        p99_us=percentile(samples_us, 99),
        min_us=float(min(samples_us)),
        max_us=float(max(samples_us)),
        stdev_us=float(statistics.stdev(samples_us)) if len(samples_us) > 1 else 0.0,
        samples_us=kept_samples(samples_us),
    )


def sample(
    setup: Callable[[], Any],
    call: Callable[[Any], R],
    *,
    repeat: int,
    warmup: int,
    sync: Callable[[], Any] | None = None,
    observe: Callable[[Any, R], None] | None = None,
) -> list[float]:
    """Time ``call(state)`` ``warmup + repeat`` times; return the last ``repeat`` samples (us).

    ``setup()`` builds the state for each sample outside the timed region (the cold
    protocol: a fresh object per sample). ``observe(state, result)`` runs after each kept
    sample, also untimed (for example to check what a call selected).
    """
    samples: list[float] = []
    for i in range(warmup + repeat):
        state = setup()
        result, us = timed(functools.partial(call, state), sync)
        if i >= warmup:
            samples.append(us)
            if observe is not None:
                observe(state, result)
    return samples


def cuda_sync(device: Any) -> Callable[[], None] | None:
    """A synchronize callable for a CUDA ``torch.device``; None for CPU devices."""
    if getattr(device, "type", str(device)) != "cuda":
        return None
    import torch

    return lambda: torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Elapsed:
    """Seconds of wall-clock and process CPU time."""

    wall_s: float
    cpu_s: float


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.elapsed`` (an :class:`Elapsed`)."""

    elapsed: Elapsed

    def __enter__(self) -> Stopwatch:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = Elapsed(time.perf_counter() - self._wall, time.process_time() - self._cpu)
