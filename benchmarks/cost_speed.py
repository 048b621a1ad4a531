"""What one ``batch_us`` call costs: the linear and roofline models.

The serving loop calls the cost model once per iteration (a million times in big runs), so
its per-call time is part of the loop's. Timed side by side in one process, best of
``--repeat`` rounds of ``--calls`` calls each: a decode-only iteration (64 requests, what
decode stretches repeat: the roofline model memoises its GEMM part on the token count) and a
mixed one (a prefill chunk of varying length: no memo), for ``linear`` and ``roofline``.
Prints microseconds per call and each over the linear model's.

Usage: python benchmarks/cost_speed.py [--calls 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from cpkv.serving.cost.model import CostModel
from cpkv.serving.cost.spec import CostSpec


def per_call_us(batch_us, calls: int, mixed: bool, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        if mixed:
            for i in range(calls):
                batch_us(8192 - (i & 63), 64, 640_000, 32_768, 40_000_000, 100)
        else:
            for _ in range(calls):
                batch_us(0, 64, 640_000, 0, 0, 0)
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spec = CostSpec(model="llama-3-8b", gpu="a100-80gb")
    models = {
        "linear": CostModel(),
        "roofline": spec.build(),
    }
    for mixed in (False, True):
        label = "mixed (prefill chunk + 64 decodes)" if mixed else "decode-only (64 requests)"
        print(label)
        base = None
        for name, model in models.items():
            us = per_call_us(model.batch_us, args.calls, mixed, args.repeat)
            base = base or us
            print(f"  {name:20s} {us:6.3f} us per call  ({us / base:.2f}x linear)")


if __name__ == "__main__":
    main()
