"""The simulation clock's range: a run whose times the clock cannot resolve is refused.

The engine keeps time in float64 microseconds, which resolve 1 µs only below
:data:`~cpkv.core.schema.limits.CLOCK_LIMIT_US` (2**53 µs, about 285 years); beyond it an
iteration's milliseconds round away and a TTFT reads 0. So:

* before a run (:func:`check_arrivals`, from the workload and ``admit.arrivals``): the last
  arrival must come before the limit: a trace's last timestamp over ``speedup`` (a repeated
  trace's last copy included), or for ``poisson`` the time the last of ``count`` arrivals
  comes before but with probability :data:`POISSON_MISS` (:func:`poisson_span_factor` times
  the expected ``count / rate_rps`` seconds); the refusal says which value would fit;
* after it (:func:`check_end`): the run's end, arrivals and service together, must too;
* a run must account for every request it was given (:func:`check_conserved`): one that
  lost a request is an internal error, never a result.
"""

from __future__ import annotations

import math
from typing import Any

from cpkv.core.errors import ConfigError
from cpkv.core.schema.limits import CLOCK_LIMIT_S, CLOCK_LIMIT_US, CLOCK_WHY

_BEYOND = f"beyond {CLOCK_LIMIT_S:.4g} s ({CLOCK_WHY})"
POISSON_MISS = 1e-9
"""The chance that a Poisson run's last arrival comes later than :func:`last_arrival_us` says."""


def poisson_span_factor(count: int) -> float:
    """``t`` >= 1 such that ``count`` Poisson arrivals span more than ``t`` times their
    expected span with probability at most :data:`POISSON_MISS` (the Chernoff bound of a
    Gamma(count) sum: ``exp(-count (t - 1 - ln t))``; 1.0 for no arrivals)."""
    if count <= 0:
        return 1.0
    need = -math.log(POISSON_MISS) / count
    low, high = 1.0, 2.0
    while high - 1.0 - math.log(high) < need:
        high *= 2.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if mid - 1.0 - math.log(mid) < need else (low, mid)
    return high


def last_arrival_us(workload: Any, arrivals: Any) -> float:
    """When the run's last request arrives (µs): exactly for ``trace`` and ``zero``; for
    ``poisson``, a time it comes before but with probability :data:`POISSON_MISS`."""
    if arrivals.process == "zero":
        return 0.0
    if arrivals.process == "poisson":
        n = workload.size
        return n / arrivals.rate_rps * 1e6 * poisson_span_factor(n)
    requests = workload.requests
    if not requests:  # drawn lazily (synthetic): no times of their own, all at 0
        return 0.0
    from cpkv.serving.input.arrivals import trace_period

    last = max(r.arrival_ms for r in requests)
    if workload.repeat > 1:
        last += (workload.repeat - 1) * trace_period(requests)
    return last / arrivals.speedup * 1e3


def check_arrivals(workload: Any, arrivals: Any) -> None:
    """ConfigError, before the run, when its arrivals reach past the clock's range."""
    last_us = last_arrival_us(workload, arrivals)
    if last_us < CLOCK_LIMIT_US:
        return
    n = workload.size
    if arrivals.process == "poisson":
        fits = last_us * arrivals.rate_rps / CLOCK_LIMIT_US
        raise ConfigError(
            f"admit.arrivals.rate_rps: {n:,} requests at {arrivals.rate_rps:g} requests/s "
            f"arrive over up to {last_us / 1e6:.4g} s (all but a {POISSON_MISS:g} chance), "
            f"{_BEYOND}; allowed: a rate above {fits:.4g} requests/s for this workload, or "
            "fewer requests"
        )
    span_us = last_us * arrivals.speedup
    raise ConfigError(
        f"admit.arrivals.speedup: the last of {n:,} requests arrives at {span_us / 1e6:.4g} s "
        f"of the trace, {last_us / 1e6:.4g} s at speedup {arrivals.speedup:g}, {_BEYOND}; "
        f"allowed: a speedup above {span_us / CLOCK_LIMIT_US:.4g}, or fewer requests "
        "(admit.workload.limit, admit.workload.repeat)"
    )


def check_end(end_us: float, count: int) -> None:
    """ConfigError when a run of ``count`` requests ended (at ``end_us``) past the clock's
    range: its latencies would be rounded to whole multiples of 2 µs or worse."""
    if end_us < CLOCK_LIMIT_US:
        return
    raise ConfigError(
        f"admit.mode=serving: the run of {count:,} requests reached {end_us / 1e6:.4g} s of "
        f"simulated time, {_BEYOND}; allowed: a run that ends sooner: fewer requests, a "
        "higher admit.arrivals.rate_rps or speedup, or a faster admit.cost"
    )


def check_conserved(count: int, ended: int) -> None:
    """RuntimeError (a bug, not a result) when fewer or more requests ended than arrived."""
    if ended != count:
        raise RuntimeError(
            f"internal error: the serving run was given {count:,} requests and accounted for "
            f"{ended:,} (finished, rejected, timed out or cancelled); no result is written"
        )
