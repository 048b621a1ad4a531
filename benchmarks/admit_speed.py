"""Admission decisions per second: cpkv's model vs the real sglang PrefillAdder, and at scale.

Usage: python benchmarks/admit_speed.py [--scenarios N] [--requests N] [--repeat N]

1. The same seeded scenarios (cpkv.admission.scenarios, CP limits off) through both backends.
   A decision is one ``add_one_req`` or ``add_chunked_req`` call; "pass" time is the sum of the
   ticks' ``duration_us`` (building the adder and scanning; the real backend's pool and radix
   tree setup is excluded), "wall" includes that setup. Needs sglang for the real side (run
   it with the oracle venv's python); without it only the model is timed.
2. A generated JSONL workload (default 100,000 requests: the ``synthetic`` workload source's
   defaults, seed 0, the workload of ``configs/perf/admit_100k*.yaml``; written to a
   temporary file): JSONL parsing is timed separately, then the model runs it
   (construction, every pass, every record, the summary) with the seed's hold-everything
   ticks, with release_each_tick, and with 64-token pages + chunked prefill 8192 + release.

Both wall-clock and process CPU time are printed (CPU time is steadier on a busy machine);
the best of ``--repeat`` runs counts.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from cpkv.admission.budgets import AdmitBudgets, CpBudgets
from cpkv.admission.scenarios import random_scenario
from cpkv.admission.ticks import run_admission
from cpkv.workload.jsonl_writer import write_jsonl
from cpkv.workload.sources import WorkloadSpec, load_workload
from cpkv.workload.synthetic import SyntheticSpec


def timed(fn, repeat):
    """(result, best wall s, best CPU s) over ``repeat`` runs."""
    best_wall = best_cpu = float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        best_wall = min(best_wall, time.perf_counter() - w)
        best_cpu = min(best_cpu, time.process_time() - c)
    return out, best_wall, best_cpu


def compare_backends(n: int, repeat: int) -> None:
    scenarios = [random_scenario(s, max_requests=40) for s in range(n)]
    scenarios.sort(key=lambda sc: sc.budgets.page_size)
    backends = ["model"]
    if importlib.util.find_spec("sglang") is not None:
        from cpkv.admission.sglang.world import load_sglang

        load_sglang()  # import once, outside the timings
        backends.append("sglang")
    else:
        print("  sglang is not installed: the real PrefillAdder side is skipped")
    rates = {}
    for backend in backends:

        def run_all(backend=backend):
            return [run_admission(sc.requests, sc.budgets, backend) for sc in scenarios]

        results, wall, cpu = timed(run_all, repeat if backend == "model" else 1)
        decisions = sum(r.summary.decisions for r in results)
        pass_s = sum(r.summary.duration_us for r in results) / 1e6
        rates[backend] = decisions / pass_s
        print(f"  {backend:6s}: {decisions} decisions in {len(scenarios)} scenarios; pass time {pass_s:.4f} s "
              f"-> {decisions / pass_s:,.0f} decisions/s; wall incl. setup {wall:.3f} s "
              f"({decisions / wall:,.0f}/s), CPU {cpu:.3f} s")  # fmt: skip
    if "sglang" in rates:
        print(
            f"  model / real PrefillAdder: {rates['model'] / rates['sglang']:,.1f}x faster (pass time; target >= 20x)"
        )


def at_scale(n: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "requests.jsonl"
        synthetic = WorkloadSpec(source="synthetic", synthetic=SyntheticSpec(count=n))
        write_jsonl(load_workload(synthetic, seed=0), path)
        spec = WorkloadSpec(source="jsonl", path=str(path))
        requests, wall, cpu = timed(lambda: load_workload(spec), repeat)
        print(
            f"  parse {n:,} JSONL lines: {wall:.3f} s wall, {cpu:.3f} s CPU ({n / wall:,.0f} lines/s)"
        )
    seed_jsonl = AdmitBudgets(
        available_tokens=200_000, cp=CpBudgets(max_total_cached_tokens=131072)
    )
    for label, budgets in (
        ("hold (seed ticks)", seed_jsonl),
        ("release_each_tick", replace(seed_jsonl, release_each_tick=True)),
        (
            "page 64, chunk 8192, release",
            replace(seed_jsonl, page_size=64, chunked_prefill_size=8192, release_each_tick=True),
        ),
    ):
        result, wall, cpu = timed(lambda b=budgets: run_admission(requests, b), repeat)
        s = result.summary
        print(f"  model, {label}: {s.decisions:,} decisions, {s.ticks:,} ticks, {s.requests_admitted:,} admitted, "
              f"{s.evicted_tokens:,} tokens evicted: {wall:.3f} s wall -> {s.decisions / wall:,.0f} decisions/s "
              f"(CPU {cpu:.3f} s -> {s.decisions / cpu:,.0f}/s; target >= 200,000)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=100)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"[1] same scenarios, both backends ({args.scenarios} seeded scenarios, up to 40 requests each)"
    )
    compare_backends(args.scenarios, args.repeat)
    print(f"[2] the model on a generated {args.requests:,}-request JSONL workload")
    at_scale(args.requests, args.repeat)


if __name__ == "__main__":
    main()
