"""Seeded random scenarios for the SGLang loop differential, in the loop oracle's format.

Each scenario draws the server (page size 1 to 16, pools from a few hundred tokens, where
decode must retract, to roomy ones; chunked prefill on or off; mixed chunk; the normal or the
overlap loop; the radix cache on or off; conservativeness; ``fcfs``, ``lof``, ``lpm``,
``hrrn``, ``shortest-prefill-first`` or ``dfs-weight``) and a workload
from one of the families below, with bursts (several requests at once) and gaps (the server
idles):

* ``queue``: many short prompts at once, a queue larger than one batch;
* ``shared``: prompts built from a few shared prefixes (system prompts, cached prefixes put in
  the tree first, repeated prompts), arriving while others with the same prefix run;
* ``long``: long prompts that chunk beside running decodes;
* ``tight``: a pool so small that decode retracts and retracted requests come back;
* ``mixed``: a bit of everything, ``ignore_eos`` on some requests.

A quarter of the scenarios schedule by priority (most requests given one, the others none:
SGLang's lowest), with a preemption threshold of 0 or 10 and either retraction order.
"""

from __future__ import annotations

import random

FAMILIES = ("queue", "shared", "long", "tight", "mixed")
DRAWN = ("queue", "shared", "long", "tight", "tight", "mixed")  # the tight pools twice as often


def _server(rng: random.Random, family: str) -> dict:
    page = rng.choice((1, 1, 1, 4, 16))
    chunk = rng.choice((None, None, 128, 256, 512, 1024))
    if chunk is not None:
        chunk = max(page, chunk // page * page)
    if family == "tight":
        kv = rng.choice((600, 900, 1400, 2200))
    else:
        kv = rng.choice((1500, 4000, 12000, 40000))
    kv = kv // page * page
    return {
        "page_size": page,
        "kv_size": kv,
        "max_running_requests": rng.choice((4, 8, 16, 64)),
        "context_len": rng.choice((4096, 8192)),
        "chunked_prefill_size": chunk,
        "max_prefill_tokens": rng.choice((512, 2048, 4096, 16384)),
        "enable_mixed_chunk": rng.random() < 0.4,
        "overlap": rng.random() < 0.5,
        "disable_radix_cache": rng.random() < 0.3,
        "schedule_policy": rng.choice(("fcfs", "fcfs", "fcfs", "lof", "lpm", "lpm")),
        "schedule_conservativeness": rng.choice(
            (0.3, 0.3, 0.6, 1.0) if family == "tight" else (1.0, 1.0, 0.3, 0.6)
        ),
        "cost": {"fixed_us": 1000.0, "prefill_token_us": 20.0, "decode_req_us": 50.0},
        "max_iterations": 20000,
    }


def _arrivals(rng: random.Random, n: int) -> list[float]:
    """Arrival times (ms): bursts at one instant, short and long gaps."""
    t, out = 0.0, []
    for _ in range(n):
        t += rng.choice(
            (0.0, 0.0, rng.uniform(0.1, 3.0), rng.uniform(3.0, 40.0), rng.uniform(40, 400))
        )
        out.append(round(t, 3))
    return out


def _prompt_ids(rng: random.Random, prefixes: list[list[int]], length: int, own: int) -> list[int]:
    """A prompt of ``length`` tokens: a shared prefix (part of one) then its own tokens."""
    ids: list[int] = []
    if prefixes and rng.random() < 0.75:
        base = rng.choice(prefixes)
        ids = base[: rng.randint(1, len(base))]
    ids = ids[:length]
    return ids + list(range(own, own + length - len(ids)))


def scenario(rng: random.Random, name: str) -> dict:
    family = rng.choice(DRAWN)
    sc = _server(rng, family)
    kv = sc["kv_size"]
    cap = max(16, min(3000, kv // 3))
    n = {"queue": rng.randint(8, 30), "tight": rng.randint(3, 10)}.get(family, rng.randint(2, 16))
    times = _arrivals(rng, n)
    prefixes = [
        list(range(100_000 * (k + 1), 100_000 * (k + 1) + rng.randint(16, cap)))
        for k in range(rng.randint(1, 3))
    ]
    if family in ("shared", "mixed") and not sc["disable_radix_cache"] and rng.random() < 0.5:
        sc["cached"] = [p[: rng.randint(16, len(p))] for p in prefixes[:1]]
    requests = []
    own = 5_000_000
    for i in range(n):
        if family == "queue":
            length = rng.randint(8, min(600, cap))
        elif family == "long":
            length = rng.randint(cap // 2, cap) if rng.random() < 0.5 else rng.randint(8, 200)
        elif family == "tight":
            length = rng.randint(20, max(21, kv // 5))
        else:
            length = rng.randint(8, cap)
        max_new = rng.randint(1, 64) if family == "queue" else rng.randint(1, 300)
        req = {"rid": f"r{i}", "arrival_ms": times[i], "max_new_tokens": max_new}
        if family in ("shared", "mixed") and rng.random() < 0.8:
            if sc.get("cached") and rng.random() < 0.3:
                req.update(
                    {"prefix_of": 0, "hit": rng.randint(1, len(sc["cached"][0])), "len": length}
                )
            else:
                req["ids"] = _prompt_ids(rng, prefixes, length, own)
                own += length
        else:
            req["len"] = length
        if family == "mixed" and rng.random() < 0.25:
            req["ignore_eos"] = True
        requests.append(req)
    if rng.random() < 0.25 and sc["schedule_policy"] != "lpm":  # priority: fcfs and lof only
        sc["enable_priority_scheduling"] = True
        sc["schedule_low_priority_values_first"] = rng.random() < 0.5
        sc["priority_scheduling_preemption_threshold"] = rng.choice((0, 10))
        sc["retraction_policy"] = rng.choice(("length", "priority"))
        for req in requests:
            if rng.random() < 0.85:
                req["priority"] = rng.choice((0, 5, 20, 40))
    # (drawn apart: the other draws stay as they were)
    apart = random.Random(name).random()
    if sc["schedule_policy"] == "lpm" and apart < 0.75:
        sc["schedule_policy"] = "hrrn" if apart < 0.5 else "dfs-weight"
    spf = sc["schedule_policy"] == "lof" and not sc.get("enable_priority_scheduling")
    if spf and not sc["disable_radix_cache"] and apart < 0.5:
        sc["schedule_policy"] = "shortest-prefill-first"
    sc["requests"] = requests
    sc["name"] = f"{name}-{family}"
    return sc


def make_scenarios(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [scenario(rng, f"s{seed}-{k:04d}") for k in range(count)]
