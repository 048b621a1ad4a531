"""What cpkv's admission-policy machinery costs on the whole Mooncake trace.

Usage: python benchmarks/policy_overhead.py [--config configs/admit/serving_mooncake.yaml]
       [--speedup 0.3] [--repeat 2]

Side by side in one process, best of ``--repeat`` process-CPU seconds of ``prepare`` +
``execute`` (no run directory) for: the defaults (no policy machinery at all), the same with
``admit.serving.policy_metrics=true`` (the machinery on, nothing changed), a few policy
features, and ``admit.serving.check_invariants=true`` (every iteration on the full path,
checked). Prints each time and its ratio to the defaults.
"""

from __future__ import annotations

import argparse
import time

from cpkv.core.config import load_config
from cpkv.core.kinds import RunContext

VARIANTS = {
    "defaults": [],
    "policy_metrics": ["admit.serving.policy_metrics=true"],
    "deadline order": ["admit.schedule_policy=deadline"],
    "lpm order": ["admit.schedule_policy=lpm"],
    "timeout + buckets": [
        "admit.serving.queue_timeout_ms=60000",
        "admit.serving.cuda_graph_buckets=[1,2,4,8,16,32,64,128,256]",
    ],
    "check_invariants": ["admit.serving.check_invariants=true"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/admit/serving_mooncake.yaml")
    parser.add_argument("--speedup", type=float, default=0.3)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    base = None
    warm = load_config("admit", args.config, [f"admit.arrivals.speedup={args.speedup}"])
    warm.spec.prepare_fn()(warm.experiment)(RunContext())  # imports and caches, not measured
    for name, overrides in VARIANTS.items():
        loaded = load_config(
            "admit", args.config, [f"admit.arrivals.speedup={args.speedup}", *overrides]
        )
        best = float("inf")
        for _ in range(args.repeat):
            c0 = time.process_time()
            out = loaded.spec.prepare_fn()(loaded.experiment)(RunContext())
            best = min(best, time.process_time() - c0)
        base = best if base is None else base
        (row,) = out.rows
        print(
            f"{name:>18}: {best:6.2f} s CPU ({best / base:5.2f} x defaults), "
            f"{row.iterations} iterations, goodput {row.goodput_requests_per_s:.3f} req/s"
        )


if __name__ == "__main__":
    main()
