"""Time the Mooncake trace replay (read + L1/L2 cache replay) and the admission after it.

Usage: python benchmarks/trace_replay.py [TRACE] [--repeat N]

Prints the median over N runs of each stage, per request and in total, and the whole
(read + replay + admission) against the 2 s target. The trace defaults to
../shared/data/mooncake_synthetic_trace.jsonl (never copied into the repo).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cpkv.trace.prefix_cache import DEFAULT_CACHE, CacheConfig, replay
from cpkv.trace.readers import read_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/data/mooncake_synthetic_trace.jsonl"
TARGET_S = 2.0


def admission_stage() -> Callable[[Sequence[Any]], Any] | None:
    """The hook: turns replayed requests into an admission run, or None when not available.

    Uses `cpkv.admission.ticks.run_admission` with the default budgets (the `model` backend).
    """
    try:
        from cpkv.admission.budgets import AdmitBudgets
        from cpkv.admission.ticks import run_admission
        from cpkv.workload.trace import admission_requests
    except ImportError:
        return None

    def run(replayed: Sequence[Any]) -> Any:
        return run_admission(admission_requests(replayed), AdmitBudgets())

    return run


def clock(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    admit = admission_stage()
    configs = {"unlimited": CacheConfig(), "default L1 2Mi, L2 2x": DEFAULT_CACHE}
    times: dict[str, list[float]] = {}
    n = 0
    for _ in range(args.repeat):
        trace, t_read = clock(lambda: read_trace(args.trace, "mooncake", 512))
        n = len(trace.requests)
        times.setdefault("read", []).append(t_read)
        for label, cfg in configs.items():
            replayed, t = clock(lambda cfg=cfg, trace=trace: replay(trace, cfg))
            times.setdefault(f"replay ({label})", []).append(t)
        if admit is not None:
            _, t = clock(lambda replayed=replayed: admit(replayed))
            times.setdefault("admission (default budgets)", []).append(t)
    print(f"{n} requests, median of {args.repeat} runs")
    print(f"{'stage':34s} {'total_ms':>10s} {'per_request_us':>15s}")
    for stage, samples in times.items():
        med = statistics.median(samples)
        print(f"{stage:34s} {med * 1e3:10.1f} {med / n * 1e6:15.1f}")
    whole = statistics.median(times["read"]) + statistics.median(
        times["replay (default L1 2Mi, L2 2x)"]
    )
    if admit is None:
        print(
            "admission: not available yet (cpkv.admission.ticks.run_admission missing); hook: admission_stage()"
        )
    else:
        whole += statistics.median(times["admission (default budgets)"])
    print(
        f"read + replay + admission: {whole:.3f} s = {whole / TARGET_S:.2f} x the {TARGET_S:.0f} s target"
    )


if __name__ == "__main__":
    main()
