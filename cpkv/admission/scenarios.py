"""Seeded random admission scenarios, for differential tests and speed benchmarks.

A scenario mixes what makes SGLang's admission interesting: pages of 1, 16 and 64 tokens
(hits not page aligned too), chunked prefill on and off, L1 and L2 hits, running decodes,
tight memory (so that load-back has to evict), ``max_running_requests``,
``prefill_max_requests`` and multi-tick runs with chunk continuation. Same seed, same
scenario.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cpkv.admission.budgets import AdmitBudgets, CpBudgets
from cpkv.workload.request import Request, RunningDecode, device_and_host_hit


@dataclass(frozen=True)
class Scenario:
    """Requests and budgets for one run."""

    seed: int
    requests: tuple[Request, ...]
    budgets: AdmitBudgets


def _tokens(rng: random.Random, page: int, high: int) -> int:
    """A hit length: often 0, often whole pages, sometimes ragged."""
    pick = rng.random()
    if pick < 0.3:
        return 0
    if pick < 0.75:
        return rng.randint(1, max(1, high // page)) * page
    return rng.randint(1, high)


def random_requests(rng: random.Random, n: int, page: int, scale: int) -> tuple[Request, ...]:
    """``n`` requests with L1/L2 hits and extends up to about ``scale`` tokens each."""
    out = []
    for k in range(n):
        mx = rng.choice([None, None, 0, 1, rng.randint(1, 600), rng.randint(3000, 6000)])
        out.append(
            Request(
                f"r{k}",
                _tokens(rng, page, scale),
                _tokens(rng, page, scale),
                rng.randint(1, scale),
                mx,
            )
        )
    return tuple(out)


def random_scenario(seed: int, *, cp: bool = False, max_requests: int = 12) -> Scenario:
    """One scenario; ``cp=False`` keeps it runnable on the real PrefillAdder."""
    rng = random.Random(seed)
    page = rng.choice([1, 1, 16, 64])
    scale = rng.choice([64, 512, 2048])
    requests = random_requests(rng, rng.randint(1, max_requests), page, scale)
    hits = [device_and_host_hit(r, page) for r in requests]
    need = sum(r.fill_tokens for r in requests) + 200 * len(requests)
    # tight: about what the L2 hits need; roomy: everything fits
    available = rng.choice(
        [0, rng.randint(0, max(1, sum(h for _, h in hits))), rng.randint(need // 4, need * 2)]
    )
    chunk = rng.choice([None, None, -1, rng.randint(page, 4 * scale), rng.randint(1, 3) * 1024])
    running = tuple(
        RunningDecode(rng.randint(0, 5000), rng.randint(0, 300), rng.random() < 0.2)
        for _ in range(rng.choice([0, 0, 1, 3]))
    )
    budgets = AdmitBudgets(
        available_tokens=available,
        evictable_tokens=rng.choice([0, 0, rng.randint(0, 4 * scale)]),
        max_prefill_tokens=rng.choice([16384, rng.randint(64, 4 * scale)]),
        chunked_prefill_size=chunk,
        page_size=page,
        new_token_ratio=rng.choice([0.7, 1.0, round(rng.random(), 3)]),
        max_new_tokens=rng.choice([128, rng.randint(0, 2000)]),
        max_running_requests=rng.choice([None, None, rng.randint(1, 8) + len(running)]),
        prefill_max_requests=rng.choice([None, None, rng.randint(1, 5)]),
        load_back_threshold=rng.choice([10, 10, 0, rng.randint(0, scale)]),
        running=running,
        cp=_random_cp(rng, scale) if cp else CpBudgets(enabled=False),
        release_each_tick=rng.random() < 0.3,
    )
    return Scenario(seed, requests, budgets)


def _random_cp(rng: random.Random, scale: int) -> CpBudgets:
    return CpBudgets(
        enabled=True,
        max_total_extend_tokens=rng.choice([None, rng.randint(1, 6 * scale)]),
        max_total_cached_tokens=rng.choice([None, rng.randint(1, 6 * scale)]),
        max_batch_requests=rng.choice([None, rng.randint(1, 6)]),
    )
