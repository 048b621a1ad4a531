"""Seeded random scenarios (the vLLM oracle's JSON format) for the differential test.

Each family stresses some rules of vLLM 0.32.0's scheduler:

- ``shared_prefix``: a few system prompts shared by many requests, identical prompts (the
  ``num_tokens - 1`` cap), a roomy pool: prefix hits, same-step hits.
- ``tiny_pool``: a pool of a handful of blocks under growing decodes: preemption, re-admission
  that hits the request's own cached blocks (or not, once evicted), eviction order.
- ``long_prefill``: prompts far longer than the budget with a long-prefill cap (sometimes
  adaptive): chunking, the cap only when more than one request exists.
- ``priority``: the priority policy with a small pool: victims by (priority, arrival), the
  0.32.0 self-preemption break, the heap order of the waiting queue.
- ``max_seqs``: a small ``max_num_seqs`` / ``max_num_active_seqs``: the request cap.
- ``burst``: many arrivals in one step, a small budget: the token budget split and stops.
- ``mixed``: 20 to 50 requests over a longer span with a tight pool and a cap: everything
  at once, for the rarer interactions.

Knobs drawn across families: block size, prefix caching on/off, ``scheduler_reserve_full_isl``,
the watermark, an explicit ``max_model_len`` that caps some requests. Every request fits the
pool on its own (so no scenario can loop on a request that never fits), and ``max_steps`` caps
each run.
"""

from __future__ import annotations

import random

FAMILIES = ("shared_prefix", "tiny_pool", "long_prefill", "priority", "max_seqs", "burst", "mixed")
MAX_STEPS = 600


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _prompt(
    rng: random.Random, rid: str, systems: list[tuple[str, int]], user_max: int, repeats: list[list]
) -> dict:
    """A request body: an earlier prompt again, a shared system prefix + user text, or unique."""
    roll = rng.random()
    if repeats and roll < 0.12:
        return {"segments": [list(s) for s in rng.choice(repeats)]}
    if systems and roll < 0.7:
        name, length = rng.choice(systems)
        segs = [[name, length], [f"u-{rid}", rng.randint(1, user_max)]]
        if rng.random() < 0.2:  # a longer shared prefix on top of the system prompt
            segs.insert(1, [f"{name}-doc{rng.randrange(2)}", rng.randint(1, user_max)])
        repeats.append(segs)
        return {"segments": segs}
    return {"prompt_len": rng.randint(1, user_max)}


def _length(req: dict) -> int:
    if "prompt_len" in req:
        return req["prompt_len"]
    return sum(n for _, n in req["segments"])


def make_scenario(seed: int, family: str | None = None) -> dict:
    """One random scenario; the same seed gives the same scenario."""
    rng = random.Random(seed)
    family = family or FAMILIES[seed % len(FAMILIES)]
    block_size = rng.choice([4, 8, 16, 16, 32])
    cfg: dict = {
        "block_size": block_size,
        "policy": "fcfs",
        "enable_prefix_caching": rng.random() < 0.85,
        "scheduler_reserve_full_isl": rng.random() < 0.7,
    }
    num_requests = rng.randint(2, 10)
    arrival_span = rng.randint(0, 20)
    user_max = 6 * block_size
    max_tokens_max = 24
    systems = [
        (f"sys{seed}-{k}", rng.randint(1, 6) * block_size + rng.choice([0, 0, 3]))
        for k in range(rng.randint(1, 3))
    ]
    budget = rng.choice([32, 64, 128, 256, 512])
    max_seqs = rng.randint(2, 16)
    pool_blocks = 400
    if family == "shared_prefix":
        pool_blocks = rng.randint(60, 400)
        num_requests = rng.randint(4, 12)
    elif family == "tiny_pool":
        pool_blocks = rng.randint(5, 16)
        user_max = 3 * block_size
        max_tokens_max = 4 * block_size
        systems = systems[:1]
        budget = rng.choice([32, 64, 128, 256])
        if rng.random() < 0.4:
            # Admission by first chunk only: a continuing chunk may need several blocks at
            # once in a full pool, so one step preempts several victims.
            cfg["scheduler_reserve_full_isl"] = False
            user_max = 8 * block_size
    elif family == "long_prefill":
        user_max = rng.choice([300, 600, 1200])
        budget = rng.choice([64, 128, 256])
        cfg["long_prefill_token_threshold"] = rng.choice([8, 16, 32, 64, 100])
        if rng.random() < 0.3:
            cfg["long_prefill_token_threshold_adaptive"] = True
        pool_blocks = rng.randint(_cdiv(user_max + 200, block_size) + 2, 500)
        num_requests = rng.randint(2, 6)
    elif family == "priority":
        cfg["policy"] = "priority"
        pool_blocks = rng.randint(6, 40)
        user_max = 3 * block_size
        max_tokens_max = 3 * block_size
    elif family == "max_seqs":
        max_seqs = rng.randint(1, 4)
        if rng.random() < 0.4:
            cfg["max_num_active_seqs"] = rng.randint(1, max_seqs)
        pool_blocks = rng.randint(20, 200)
        num_requests = rng.randint(4, 12)
    elif family == "burst":
        arrival_span = rng.randint(0, 2)
        num_requests = rng.randint(8, 20)
        budget = rng.choice([16, 32, 48, 64])
        pool_blocks = rng.randint(30, 300)
    elif family == "mixed":
        num_requests = rng.randint(20, 50)
        arrival_span = rng.randint(10, 60)
        pool_blocks = rng.randint(12, 80)
        user_max = rng.choice([4, 8, 12]) * block_size
        max_tokens_max = rng.choice([8, 32, 64])
        cfg["long_prefill_token_threshold"] = rng.choice([0, 0, 16, 64])
    if rng.random() < 0.3 and family != "priority":
        cfg["policy"] = "priority"
    if rng.random() < 0.15:
        cfg["watermark"] = rng.choice([0.01, 0.05, 0.1])
    max_seqs = min(max_seqs, budget)
    cfg.update({"max_num_batched_tokens": budget, "max_num_seqs": max_seqs})
    if cfg.get("long_prefill_token_threshold", 0) == 0 and rng.random() < 0.2:
        cfg["long_prefill_token_threshold"] = rng.choice([4, 16, 48])

    requests = []
    repeats: list[list] = []
    for i in range(num_requests):
        rid = f"r{i}"
        body = _prompt(rng, rid, systems, user_max, repeats)
        req = {
            "id": rid,
            "arrival": rng.randint(0, arrival_span),
            "max_tokens": rng.randint(1, max_tokens_max),
            **body,
        }
        if cfg["policy"] == "priority":
            req["priority"] = rng.randint(0, 3)
        requests.append(req)
    longest = max(_length(r) + r["max_tokens"] for r in requests)
    if rng.random() < 0.15:
        # An explicit max_model_len that stops some requests before max_tokens.
        longest_prompt = max(_length(r) for r in requests)
        mml = max(
            longest_prompt + 2,
            longest - rng.randint(1, 12),
            cfg.get("long_prefill_token_threshold", 0),
        )
        cfg["max_model_len"] = mml
        longest = min(longest, mml)
    # Every request must fit the pool alone (with the watermark), or it would never finish.
    need = _cdiv(longest, block_size) + 1
    pool_blocks = max(pool_blocks, need + 1)
    while need + int(cfg.get("watermark", 0.0) * pool_blocks) > pool_blocks - 1:
        pool_blocks += 1
    cfg["num_gpu_blocks"] = pool_blocks
    return {"name": f"{family}-{seed}", "config": cfg, "max_steps": MAX_STEPS, "requests": requests}


def make_scenarios(count: int, seed: int = 0) -> list[dict]:
    """``count`` scenarios, the families in turn."""
    return [make_scenario(seed * 1_000_003 + k, FAMILIES[k % len(FAMILIES)]) for k in range(count)]
