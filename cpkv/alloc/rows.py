"""Row fields shared by the allocator benchmarks (``cpkv alloc l1``, ``cpkv alloc host``).

A benchmark row is the case's identity fields (:class:`BenchIdentity`, which a benchmark may
extend), then the timing fields of :class:`TimedFields`, then anything the benchmark adds::

    @dataclass(frozen=True)
    class MyRow(TimedFields, BenchIdentity):  # fields: BenchIdentity's, TimedFields', MyRow's
        vs_reference: float | None = metric(unit="x", timing=True, default=None)

(dataclass fields follow the reversed method resolution order, so the base listed last
comes first.) :func:`timed_fields` fills the timing fields from :class:`cpkv.core.timing.Stats`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpkv.core.timing import Stats
from cpkv.runs.results import metric, samples

TABLE_COLUMNS = (
    "impl", "method", "op", "pattern", "total_pages", "request_pages",
    "p50_us", "p95_us", "p99_us", "mean_us", "contiguous_ratio",
)  # fmt: skip
"""The columns of the benchmarks' results tables (a benchmark may append its own)."""


@dataclass(frozen=True)
class BenchIdentity:
    """What an allocator bench row measured: the identity fields ``cpkv diff`` matches rows
    on, shared by both benches (the L1 bench adds its own after these)."""

    bench: str
    impl: str
    method: str
    op: str
    protocol: str
    pattern: str
    device: str
    total_pages: int
    request_pages: int
    page_size: int


@dataclass(frozen=True)
class TimedFields:
    """How many samples were kept, their spread in microseconds, how often the selection
    was physically contiguous, and the raw samples (at most
    :data:`cpkv.core.timing.SAMPLES_KEPT`; ``cpkv diff`` rank-tests them)."""

    repeat: int
    mean_us: float = metric(unit="us", timing=True)
    p25_us: float = metric(unit="us", timing=True)
    p50_us: float = metric(unit="us", timing=True)
    p75_us: float = metric(unit="us", timing=True)
    p95_us: float = metric(unit="us", timing=True)
    p99_us: float = metric(unit="us", timing=True)
    min_us: float = metric(unit="us", timing=True)
    max_us: float = metric(unit="us", timing=True)
    stdev_us: float = metric(unit="us", timing=True)
    contiguous_ratio: float = metric(lower_is_better=False)
    samples_us: tuple[float, ...] = samples(unit="us")


def timed_fields(stats: Stats, contiguous: int) -> dict[str, Any]:
    """The :class:`TimedFields` of a row, from its samples' ``stats`` and the number of
    kept samples whose selection was contiguous."""
    return {
        "repeat": stats.n,
        "mean_us": stats.mean_us,
        "p25_us": stats.p25_us,
        "p50_us": stats.p50_us,
        "p75_us": stats.p75_us,
        "p95_us": stats.p95_us,
        "p99_us": stats.p99_us,
        "min_us": stats.min_us,
        "max_us": stats.max_us,
        "stdev_us": stats.stdev_us,
        "contiguous_ratio": contiguous / stats.n if stats.n else 0.0,
        "samples_us": stats.samples_us,
    }


def round_shares(repeat: int, rounds: int) -> list[int]:
    """How many samples each of ``rounds`` passes over the cases keeps: ``repeat`` split as
    evenly as it goes (the ``rounds`` key of the allocator benchmarks)."""
    return [repeat // rounds + (r < repeat % rounds) for r in range(rounds)]


def check_rounds(rounds: int, repeat: int) -> None:
    """Validate a benchmark block's ``rounds`` against its ``repeat``."""
    from cpkv.core.schema import positive, require

    positive("rounds", rounds)
    require(
        rounds <= repeat,
        "rounds",
        f"{rounds} rounds cannot share {repeat} samples; allowed: 1..{repeat}",
    )


def bench_headline(rows: list[Any]) -> dict[str, float]:
    """The numbers that stand for an allocator run (sweep summaries, ``cpkv ls``, the last
    line of the output): the geometric mean p50 over every row; the median ``vs_reference``
    over the rows of the other impls (the speed-up); the median ``vs_fifo_p99`` over the
    contiguous rows of the impls other than the reference when any ran, else of all (the
    price of contiguity at the tail; host only). Ratios appear only when measured."""
    import statistics

    out: dict[str, float] = {}
    p50 = [r.p50_us for r in rows if r.p50_us > 0]
    if p50:
        out["gmean_p50_us"] = statistics.geometric_mean(p50)
    speedups = [r.vs_reference for r in rows if r.impl != "reference" and r.vs_reference]
    if speedups:
        out["median_vs_reference"] = statistics.median(speedups)
    contiguous = [r for r in rows if getattr(r, "vs_fifo_p99", None) and r.method == "contiguous"]
    fast = [r for r in contiguous if r.impl != "reference"] or contiguous
    if fast:
        out["median_vs_fifo_p99"] = statistics.median(r.vs_fifo_p99 for r in fast)
    return out
