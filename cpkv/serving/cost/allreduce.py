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
    link_us = link_gb_per_s * 1e3  # bytes per microsecond
    small = minimum(size_bytes, regimes.switch_bytes)
    large = size_bytes - small
    sent = ring_factor(workers) / link_us
    return regimes.latency_us + sent * (small / regimes.small_bw_eff + large / regimes.bw_eff)


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
