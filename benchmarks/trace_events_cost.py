"""What ``admit.serving.trace_events: true`` costs: the same serving run with and without it,
side by side in one process.

Usage: python benchmarks/trace_events_cost.py [--config configs/serving.yaml]
       [--repeat 3] [OVERRIDE ...]

Each variant (plain; ``trace_events=true``; with ``admit.cluster.instances=4`` too, plain and
traced) is prepared and executed without a run directory (the simulation, the metrics and the
files' texts, no plots), best of ``--repeat`` runs, interleaved. Prints the times, the ratio to
the plain run, the iterations and the size of ``trace.json``, and checks that the summary row
is the same with and without trace events (counts exactly, times within 1e-9 relative: a
traced run takes every iteration in full, a plain one sums stretches in closed form).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

from cpkv.core.config import load_config
from cpkv.core.kinds import RunContext


def close_rows(a: list, b: list) -> bool:
    """The same rows: every count equal, every float within 1e-9 relative (a traced run takes
    each iteration in full, the plain one sums stretches in closed form)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        left, right = dataclasses.asdict(x), dataclasses.asdict(y)
        if left.keys() != right.keys():
            return False
        for key, value in left.items():
            other = right[key]
            if isinstance(value, float) and isinstance(other, float):
                if not math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-12):
                    return False
            elif value != other:
                return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/serving.yaml")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    variants = {
        "1 instance": [],
        "1 instance, trace events": ["admit.serving.trace_events=true"],
        "4 instances": ["admit.cluster.instances=4"],
        "4 instances, trace events": [
            "admit.cluster.instances=4",
            "admit.serving.trace_events=true",
        ],
    }
    best = dict.fromkeys(variants, float("inf"))
    outputs = {}
    for _ in range(args.repeat):
        for name, extra in variants.items():
            loaded = load_config("admit", args.config, [*args.overrides, *extra])
            w0 = time.perf_counter()
            out = loaded.spec.prepare_fn()(loaded.experiment)(RunContext())
            best[name] = min(best[name], time.perf_counter() - w0)
            outputs[name] = out
    same = all(
        close_rows(outputs[f"{n}, trace events"].rows, outputs[n].rows)
        for n in ("1 instance", "4 instances")
    )
    for name in variants:
        out = outputs[name]
        base = best[name.removesuffix(", trace events")]
        size = len(out.extras.get("trace.json", "")) / 1e6
        print(
            f"{name:>26}: {best[name]:6.2f} s ({best[name] / base:4.2f}x), "
            f"{out.rows[0].iterations} iterations, trace.json {size:.1f} MB"
        )
    print(
        "rows with and without trace events: "
        + ("the same (counts exactly, times within 1e-9 relative)" if same else "DIFFERENT")
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
