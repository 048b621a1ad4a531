"""The `trace` workload source of `cpkv admit`: a request trace replayed through the tiered
prefix-cache model (`cpkv.trace.prefix_cache.replay`) becomes the waiting queue.

Each trace request becomes `Request(rid="r<index>", l1, l2, extend, max_new_tokens=output_length,
arrival_ms=timestamp)`, in trace order; `<index>` is the request's order in the trace file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cpkv.core.errors import ConfigError
from cpkv.core.suggest import did_you_mean
from cpkv.trace.prefix_cache import CachedRequest, replay
from cpkv.trace.readers import TRACE_FORMATS, Trace, read_trace
from cpkv.workload.request import Request


def trace_requests(spec: Any) -> tuple[Request, ...]:
    """`admit.workload` (source `trace`): read `path` (`format`, `block_size`, `start`,
    `limit`), replay it through `cache`, return the admission requests."""
    return admission_requests(replay(read_workload_trace(spec), spec.cache))


def read_workload_trace(spec: Any) -> Trace:
    """The trace `admit.workload` names (checked first; errors name `admit.workload.*`)."""
    check_trace_spec(spec)
    return read_trace(
        spec.path, spec.format, spec.block_size, spec.start, spec.limit,
        path_key="admit.workload.path", prefix=spec.prefix,
    )  # fmt: skip


def check_trace_spec(spec: Any) -> None:
    """ConfigError unless `admit.workload` names a trace file and a known trace format."""
    if spec.path is None:
        raise ConfigError("admit.workload.path: the trace source needs a trace file path")
    if spec.format not in TRACE_FORMATS:
        allowed = ", ".join(TRACE_FORMATS.allowed())
        raise ConfigError(
            f"admit.workload.format: unknown trace format {spec.format!r}"
            f"{did_you_mean(spec.format, TRACE_FORMATS.allowed())} (allowed: {allowed})"
        )


def admission_requests(replayed: Iterable[CachedRequest]) -> tuple[Request, ...]:
    """Replayed trace requests (their L1/L2 hits found) as admission requests, in order."""
    return tuple(
        Request(
            r.rid,
            r.l1_cached_tokens,
            r.l2_cached_tokens,
            r.extend_tokens,
            r.max_new_tokens,
            0,
            float(r.arrival_ms),
        )
        for r in replayed
    )
