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
memory) take a few microseconds. Both engines' kernels are timed by SGLang's kernel test
(``sgl-kernel/tests/test_trt_reduce.py``: ``n`` float32 values, so ``4n`` bytes, from 2 KiB
to 4 MiB) on H100 (sgl-project/sglang#2904, at 2, 4 and 8 GPUs) and on A100
(sgl-project/sglang#2688, 2 KiB to 8 MiB at 2 GPUs, to 4 MiB at 4, and 2 and 16 KiB at 8).
Each table fits one latency and one bandwidth per GPU count (relative least squares,
:data:`CUSTOM_ALLREDUCE`: median errors 1.4–11.8 %, worst 3.6–17.4 %; at 8 A100s, with two
small sizes only, the latency with the 4-GPU bandwidth); a message up to the largest size
both tables measured at every count they fit, :data:`CUSTOM_MAX_BYTES`, takes that line, a
larger one NCCL's time above::

    custom_us = latency_us + 2(n−1)/n · B / (bw_eff · L)      (B <= 4 MiB)

``admit.cost.allreduce`` picks the kernels: ``nccl``, ``sglang`` (TensorRT-LLM's kernels, as
SGLang runs them) or ``vllm``; null follows ``admit.cost.cpu.engine`` (``none``: NCCL). A GPU
takes the table of its generation (:attr:`~cpkv.serving.cost.gpus.Gpu.custom_allreduce`: the
A100s and the GPUs calibrated as A100s take A100's, the others H100's; the latency is a
kernel launch and an NVLink round trip, the bandwidth a share of the GPU's own link). Over
more GPUs than measured, or a number between, the next measured count above is used;
beyond 8 GPUs (one NVLink node), NCCL.
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


CUSTOM_MAX_BYTES = 4 << 20
"""The largest message the custom kernels' fits price: 1,048,576 float32 values, the largest
both tables measured at 2 and 4 GPUs (the engines' own limit is 8 MiB)."""
CUSTOM_VALUES = (512, 4096, 32768, 262144, 524288, 1048576, 2097152)
"""The message sizes of SGLang's kernel test, in float32 values (4 bytes each)."""
CUSTOM_LATENCIES_US = {
    "h100": {
        "sglang": {2: (3.7, 3.9, 4.5, 7.9, 12.5, 19.9), 4: (4.8, 3.7, 4.8, 13.9, 20.2, 31.1),
                   8: (5.9, 5.7, 7.8, 16.7, 22.1, 33.8)},
        "vllm": {2: (9.5, 8.8, 8.7, 12.9, 17.7, 26.6), 4: (9.1, 8.5, 9.2, 20.6, 26.9, 40.2),
                 8: (10.1, 9.3, 11.8, 24.1, 30.4, 45.0)},
    },
    "a100": {
        "sglang": {2: (11.9, 13.6, 12.2, 17.0, 22.8, 32.6, 54.3),
                   4: (11.9, 14.0, 13.7, 20.6, 30.6, 45.5), 8: (13.7, 16.5)},
        "vllm": {2: (13.0, 11.3, 12.1, 17.6, 22.3, 32.5, 55.3),
                 4: (13.5, 12.1, 13.5, 23.9, 31.3, 47.1), 8: (14.0, 14.2)},
    },
}  # fmt: skip
"""The published latencies (µs) the fits come from, by GPU generation, kernels and GPU
count, at the first sizes of :data:`CUSTOM_VALUES`."""
CUSTOM_LINK_GB_PER_S = {"h100": 450.0, "a100": 300.0}
"""The NVLink bandwidth (one way) each table's ``bw_eff`` is a share of."""
CUSTOM_ALLREDUCE = {
    "h100": {
        "sglang": {2: (3.819, 0.5623), 4: (4.043, 0.458), 8: (6.062, 0.5198)},
        "vllm": {2: (8.735, 0.529), 4: (8.681, 0.3996), 8: (10.023, 0.413)},
    },
    "a100": {
        "sglang": {2: (12.188, 0.6749), 4: (12.683, 0.6252), 8: (14.769, 0.6252)},
        "vllm": {2: (11.833, 0.656), 4: (12.715, 0.5738), 8: (14.006, 0.5738)},
    },
}
"""``(latency_us, bw_eff)`` of each engine's custom all-reduce by GPU generation and GPU count,
fitted to :data:`CUSTOM_LATENCIES_US` (module docstring)."""
ALLREDUCE_KINDS = ("nccl", "sglang", "vllm")


def custom_line(kind: str, workers: int, table: str = "h100") -> tuple[float, float] | None:
    """``(latency_us, bw_eff)`` of ``kind``'s custom all-reduce over ``workers`` GPUs of the
    generation ``table`` names (the next measured count at or above), or None where NCCL
    runs (``nccl``, or beyond a node)."""
    fits = CUSTOM_ALLREDUCE[table].get(kind)
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
