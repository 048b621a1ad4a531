"""Cost of one waiting-queue ordering (SGLang's calc_priority model), per policy and queue size.

Usage: python benchmarks/schedule_policy_speed.py [--trace PATH] [--repeat N]

The Mooncake synthetic trace is replayed through the tiered prefix cache (default capacities)
to give every request its L1/L2 hit; the first N requests (N = 64, 128, 1024 and all) form the
waiting queue, with their block hashes, seeded priorities and arrival stamps. Each policy sorts
a fresh copy of the queue ``--repeat`` times (the hits come from a dict: the cache lookup is the
loop's cost, not the order's). Printed: microseconds per ordering (best of the repeats) and the
ratio to ``list.sort`` on one attribute (``queue_entry_us``) of the same queue, measured in the
same run, side by side. ``lpm`` and ``hrrn`` above 128 requests are SGLang's FCFS fallback.
"""

from __future__ import annotations

import argparse
import random
import time
from operator import attrgetter

from cpkv.admission.schedule_policy import (
    SCHEDULE_POLICIES,
    QueuedRequest,
    SchedulePolicyConfig,
    WaitingQueueOrder,
)
from cpkv.trace.prefix_cache import DEFAULT_CACHE, replay
from cpkv.trace.readers import read_trace


def best_us(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="../shared/data/mooncake_synthetic_trace.jsonl")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    trace = read_trace(args.trace, "mooncake", 512)
    cached = replay(trace, DEFAULT_CACHE)
    rng = random.Random(0)
    requests = [
        QueuedRequest(
            c.rid, c.input_length, c.max_new_tokens, rng.choice([0, 1, 5, 10]),
            c.arrival_ms * 1000.0, rng.randint(0, 100_000), 0, tuple(t.hash_ids),
        )
        for c, t in zip(cached, trace.requests, strict=True)
    ]  # fmt: skip
    hits = {c.rid: (c.l1_cached_tokens, c.l2_cached_tokens) for c in cached}
    rank = {}
    for t in trace.requests:
        for h in t.hash_ids:
            rank.setdefault(h, len(rank))
    match = lambda r: hits[r.rid]  # noqa: E731
    print(f"{'policy':<24}" + "".join(f"{n:>22}" for n in (64, 128, 1024, len(requests))))
    for policy in SCHEDULE_POLICIES:
        cells = []
        for n in (64, 128, 1024, len(requests)):
            queue = requests[:n]
            base = best_us(
                lambda q=queue: list(q).sort(key=attrgetter("queue_entry_us")), args.repeat
            )
            cfg = SchedulePolicyConfig(
                schedule_policy=policy,
                enable_priority_scheduling=policy in ("fcfs", "lof"),
            )
            order = WaitingQueueOrder(cfg, block_size=512, seed=0)
            us = best_us(
                lambda q=queue, o=order: o.sort(list(q), match, 50_000, rank.get), args.repeat
            )
            cells.append(f"{us:>10.0f} us {us / base:>6.1f}x")
        print(f"{policy:<24}" + "".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
