"""Seed 004's policies as continuous admission policies of the serving loop.

Every iteration, after the running requests decoded (decode first):

* ``conservative``: scan the queue (``admit.kv.scan``: ``first_fit``, the seed's, or
  ``fcfs_stop``) and admit each request whose reservation
  ``ceil((prompt - L1 hit + max_new left) / block_size)`` blocks is free; it grows inside
  its reservation and is never preempted by growth;
* ``optimistic``: the same scan on the current prompt blocks ``ceil((prompt - L1 hit) /
  block_size)``; growth that does not fit preempts (``admit.kv.victim``);
* then the per-iteration token budget (``admit.iteration``): ``budget_tokens`` minus one
  token per decoding request goes to the admitted requests' prompts, oldest admission
  first, at most ``chunk_tokens`` per request per iteration (chunked prefill);
* ``iteration``: the budget is the admission rule: a waiting request is admitted (on its
  current prompt blocks, like ``optimistic``, first come first served) when the budget
  left this iteration can start its prefill and its blocks are free.

A scan re-examines the requests it skipped only when blocks were freed or the prefix cache
changed since the last scan; otherwise it looks at the newly queued requests alone (the
skipped ones cannot fit: they need no fewer blocks than before and no more are free).
"""

from __future__ import annotations

from typing import Any

from cpkv.serving.kv_pool import PREFILL, Req


def block_step(sim: Any, decoded: int) -> None:
    """Admission and prefill of one iteration for ``conservative``/``optimistic``/``iteration``."""
    extra = sim.extra  # issue 13: weighted budget, slots, profiled (cpkv.serving.lifecycle)
    budget = sim.budget_tokens - decoded if extra is None else extra.prefill_budget(decoded)
    if sim.policy == "profiled":
        extra.profiled_scan()
    elif sim.policy != "iteration":
        _scan(sim)
    keep = []
    for r in sim.prefilling:
        if budget > 0:
            budget -= _chunk(sim, r, budget)
        (sim.completed if r.filled_tokens >= r.fill_tokens else keep).append(r)
    sim.prefilling = keep
    if sim.policy == "iteration":
        waiting = sim.waiting
        taken = 0
        while budget > 0 and taken < len(waiting):
            r = waiting[taken]
            if extra is not None and extra.slots_full():
                sim.stop_counts["max_running_requests"] = (
                    sim.stop_counts.get("max_running_requests", 0) + 1
                )
                break
            device, host = sim.hit(r)
            if not sim.pool.fits(r.fill_tokens - device, None):
                stop = "kv_blocks" if extra is None else extra.kv_stop(r.fill_tokens - device)
                sim.stop_counts[stop] = sim.stop_counts.get(stop, 0) + 1
                break
            taken += 1
            sim.admit(r, device, host, None)
            budget -= _chunk(sim, r, budget)
            (sim.completed if r.filled_tokens >= r.fill_tokens else sim.prefilling).append(r)
        if extra is not None and budget <= 0 and taken < len(waiting):  # issue 13: named
            sim.stop_counts["token_budget"] = sim.stop_counts.get("token_budget", 0) + 1
        del waiting[:taken]


def _reserve(sim: Any, r: Req, device: int) -> int | None:
    """Tokens ``conservative`` reserves: the prompt to fill plus every token left to generate."""
    if sim.policy != "conservative":
        return None
    return r.fill_tokens - device + r.max_new_tokens - r.generated


def _scan(sim: Any) -> None:
    pool, waiting, hits = sim.pool, sim.waiting, sim.hits
    full = pool.free_blocks > sim.scan_free or hits.version != sim.scan_version
    start = 0 if full else sim.scan_seen
    if start >= len(waiting) or (start and sim.scan == "fcfs_stop"):
        return
    kept: list[Req] = []
    extra = sim.extra
    for k in range(start, len(waiting)):
        r = waiting[k]
        if extra is not None and extra.slots_full():  # issue 13: max_running_requests
            sim.stop_counts["max_running_requests"] = (
                sim.stop_counts.get("max_running_requests", 0) + 1
            )
            kept.extend(waiting[k:])
            break
        fits = True
        # the need with the largest hit it can have: no lookup (not for a swapped request)
        device = hits.l1_upper(r) if extra is None else None
        if device is not None:
            fits = pool.fits(r.fill_tokens - device, _reserve(sim, r, device))
        if fits:
            device, host = sim.hit(r)
            reserve = _reserve(sim, r, device)
            fits = pool.fits(r.fill_tokens - device, reserve)
        if fits:
            sim.admit(r, device, host, reserve)
            sim.prefilling.append(r)
            continue
        stop = "kv_blocks"
        if extra is not None:  # issue 13: blocks the safety margin keeps
            reserve = _reserve(sim, r, device)
            stop = extra.kv_stop(r.fill_tokens - device if reserve is None else reserve)
        sim.stop_counts[stop] = sim.stop_counts.get(stop, 0) + 1
        kept.append(r)
        if sim.scan == "fcfs_stop":
            kept.extend(waiting[k + 1 :])
            break
    waiting[start:] = kept
    sim.scan_seen = len(waiting)
    sim.scan_free = pool.free_blocks
    sim.scan_version = hits.version


def _chunk(sim: Any, r: Req, budget: int) -> int:
    """Compute up to ``chunk_tokens`` of ``r``'s prompt within ``budget``; returns the tokens."""
    assert r.state == PREFILL
    extend = min(r.fill_tokens - r.filled_tokens, sim.chunk_tokens, budget)
    sim.prefill_tokens += extend
    sim.prefill_context += r.filled_tokens + extend
    sim.prefill_attention_pairs += extend * r.filled_tokens + extend * (extend + 1) // 2
    r.filled_tokens += extend
    r.prefilled += extend
    return extend
