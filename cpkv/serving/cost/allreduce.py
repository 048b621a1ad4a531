"""The tensor-parallel all-reduce time: a latency and two bandwidth regimes.

NCCL moves a small message with a low-latency protocol (little fixed cost, little bandwidth)
and a large one with a bandwidth protocol; measured all-reduce times rise steeply over the
first kilobytes and then follow the link's bandwidth. For ``n`` workers and ``B`` bytes over
a link of ``L`` bytes per microsecond (one direction), with the ring's ``2(n-1)/n`` bytes per
byte reduced::

    time_us = latency_us + 2(n-1)/n · (min(B, switch_bytes) / (small_bw_eff·L)
                                       + max(B - switch_bytes, 0) / (bw_eff·L))

continuous and non-decreasing in ``B`` (both bandwidths are positive); ``switch_bytes = 0``
is one latency and one bandwidth. One worker has no all-reduce: 0. :func:`allreduce_us` is
the one place the formula is written; the roofline's iterations and the fit to measured
tables (:mod:`cpkv.serving.cost.fitting.allreduce`) both call it.

**The engines' own all-reduce.** SGLang and vLLM do not send a decode step's small messages
through NCCL: their custom all-reduce kernels (one-shot and two-shot, over NVLink peer
memory) take a few microseconds. Their published latencies on H100
(sgl-project/sglang#2904, 512 B to 1 MiB at 2, 4 and 8 GPUs, both engines' kernels) fit one
latency and one bandwidth per GPU count (relative least squares, :data:`CUSTOM_ALLREDUCE`:
median errors 1.4–11.8 %, worst 3.6–17.4 %); a message up to the largest size measured,
:data:`CUSTOM_MAX_BYTES`, takes that line, a larger one NCCL's time above::

    custom_us = latency_us + 2(n−1)/n · B / (bw_eff · L)      (B <= 1 MiB)

``admit.cost.allreduce`` picks the kernels: ``nccl``, ``sglang`` (TensorRT-LLM's kernels, as
SGLang runs them) or ``vllm``; null follows ``admit.cost.cpu.engine`` (``none``: NCCL). The
fits are H100's; the other GPUs take them (the latency is a kernel launch and an NVLink round
trip; the bandwidth a share of the GPU's own link). Over more GPUs than measured, or a number
between, the next measured count above is used; beyond 8 GPUs (one NVLink node), NCCL.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cpkv.serving.cost.calibration import Calibration


@dataclass(frozen=True)
class AllReduceRegimes:
    """The all-reduce numbers of one worker count (the ``allreduce_*`` calibration keys)."""

    latency_us: float
    small_bw_eff: float  # achieved / link bandwidth below switch_bytes
    switch_bytes: int
    bw_eff: float  # achieved / link bandwidth above switch_bytes


def ring_factor(workers: int) -> float:
    """Bytes each GPU sends per byte reduced by a ring all-reduce: ``2(n-1)/n``."""
    return 2.0 * (workers - 1) / workers


def allreduce_us(
    size_bytes: Any,
    workers: int,
    link_gb_per_s: float,
    regimes: AllReduceRegimes,
    minimum: Any = min,
) -> Any:
    """The time of one all-reduce of ``size_bytes`` over ``workers`` GPUs (see the module
    docstring); ``minimum`` is ``min`` for a number, ``numpy.minimum`` for an array."""
    if workers <= 1:
        return 0.0 * size_bytes
    return _regimes_us(size_bytes, ring_factor(workers), link_gb_per_s, regimes, minimum)


def allgather_us(
    size_bytes: float, workers: int, link_gb_per_s: float, regimes: AllReduceRegimes
) -> float:
    """The time of one all-gather that leaves ``size_bytes`` (every worker's share together)
    on each of ``workers`` GPUs: the same latency and bandwidth regimes as the all-reduce,
    with the ring all-gather's ``(n−1)/n`` bytes sent per byte gathered (an all-reduce is a
    reduce-scatter and an all-gather: half its ring factor)::

        time_us = latency_us + (n-1)/n · (min(B, switch_bytes) / (small_bw_eff·L)
                                          + max(B - switch_bytes, 0) / (bw_eff·L))

    0 on one worker, or for nothing to gather."""
    if workers <= 1 or size_bytes <= 0:
        return 0.0
    return _regimes_us(size_bytes, (workers - 1) / workers, link_gb_per_s, regimes, min)


def _regimes_us(
    size_bytes: Any, sent_per_byte: float, link_gb_per_s: float, regimes: AllReduceRegimes,
    minimum: Any,
) -> Any:  # fmt: skip
    """The latency plus ``sent_per_byte`` bytes a GPU sends per byte of the message over the
    link, the bytes up to ``switch_bytes`` at the low-latency regime's efficiency and the rest
    at the bandwidth regime's."""
    link_us = link_gb_per_s * 1e3  # bytes per microsecond
    small = minimum(size_bytes, regimes.switch_bytes)
    large = size_bytes - small
    sent = sent_per_byte / link_us
    return regimes.latency_us + sent * (small / regimes.small_bw_eff + large / regimes.bw_eff)


CUSTOM_MAX_BYTES = 1 << 20
"""The largest message the custom kernels' fits were measured at (sglang#2904's table)."""
CUSTOM_ALLREDUCE = {
    "sglang": {2: (3.82, 0.1406), 4: (4.04, 0.1145), 8: (6.06, 0.1299)},
    "vllm": {2: (8.74, 0.1323), 4: (8.68, 0.0999), 8: (10.02, 0.1032)},
}
"""``(latency_us, bw_eff)`` of each engine's custom all-reduce by GPU count, fitted to
sgl-project/sglang#2904's H100 latencies (module docstring)."""
CUSTOM_LATENCIES_US = {
    "sglang": {2: (3.7, 3.9, 4.5, 7.9, 12.5, 19.9), 4: (4.8, 3.7, 4.8, 13.9, 20.2, 31.1),
               8: (5.9, 5.7, 7.8, 16.7, 22.1, 33.8)},
    "vllm": {2: (9.5, 8.8, 8.7, 12.9, 17.7, 26.6), 4: (9.1, 8.5, 9.2, 20.6, 26.9, 40.2),
             8: (10.1, 9.3, 11.8, 24.1, 30.4, 45.0)},
}  # fmt: skip
"""The published latencies (us) the fits come from, at :data:`CUSTOM_SIZES` bytes."""
CUSTOM_SIZES = (512, 4096, 32768, 262144, 524288, 1048576)
ALLREDUCE_KINDS = ("nccl", "sglang", "vllm")


def custom_line(kind: str, workers: int) -> tuple[float, float] | None:
    """``(latency_us, bw_eff)`` of ``kind``'s custom all-reduce over ``workers`` GPUs (the next
    measured count at or above), or None where NCCL runs (``nccl``, or beyond a node)."""
    fits = CUSTOM_ALLREDUCE.get(kind)
    if fits is None or workers <= 1:
        return None
    for count in sorted(fits):
        if count >= workers:
            return fits[count]
    return None


def engine_allreduce_us(
    size_bytes: float, workers: int, link_gb_per_s: float, regimes: AllReduceRegimes,
    custom: tuple[float, float] | None,
) -> float:  # fmt: skip
    """One all-reduce under an engine: its custom kernels' line up to :data:`CUSTOM_MAX_BYTES`
    (``custom``, from :func:`custom_line`), NCCL's time (:func:`allreduce_us`) above or
    without them."""
    if custom is None or size_bytes > CUSTOM_MAX_BYTES or workers <= 1:
        return allreduce_us(size_bytes, workers, link_gb_per_s, regimes)
    latency_us, bw_eff = custom
    return latency_us + ring_factor(workers) * size_bytes / (bw_eff * link_gb_per_s * 1e3)


def regimes_of(cal: Calibration) -> AllReduceRegimes:
    """The all-reduce keys of a calibration."""
    return AllReduceRegimes(
        cal.allreduce_latency_us,
        cal.allreduce_small_bw_eff,
        cal.allreduce_switch_bytes,
        cal.allreduce_bw_eff,
    )


def with_regimes(cal: Calibration, regimes: AllReduceRegimes) -> Calibration:
    """``cal`` with its all-reduce keys replaced by ``regimes``."""
    return replace(
        cal,
        allreduce_latency_us=regimes.latency_us,
        allreduce_small_bw_eff=regimes.small_bw_eff,
        allreduce_switch_bytes=regimes.switch_bytes,
        allreduce_bw_eff=regimes.bw_eff,
    )
