"""Decode-only stretches of the serving loop, run without the per-iteration machinery.

When nothing waits, nothing is being prefilled and requests are running, the next
iterations only decode until something happens: a request arrives, a request generates
its last token, or a step's growth does not fit. :func:`decode_stretch` runs those
iterations in a tight loop over the pool's aggregates (O(1) per iteration: the blocks the
step needs come from ``counts_free[(-G) % block]``, the context read from ``sum_cbase +
n G``) and stops *before* the iteration in which one of these happens, which the full
iteration then handles. Each iteration is the one the full loop would run, float for
float (same cost-model call, same ratio decay steps, same timeline sample), so results do
not depend on it.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Any

from cpkv.serving.kv_pool import RUNNING


def decode_stretch(sim: Any) -> int:
    """Run the decode-only iterations from now until the next event; returns how many."""
    pool, order = sim.pool, sim.order
    heap = pool.fin_heap
    while heap and not (heap[0][3].epoch == heap[0][2] and heap[0][3].state == RUNNING):
        heapq.heappop(heap)  # entries of requests that left
    if not heap:
        return 0
    fin_next = heap[0][0]
    arrival = order[sim.next_arrival].arrival if sim.next_arrival < len(order) else float("inf")
    n, B = pool.n_run, pool.B
    counts_free, counts_all = pool.counts_free, pool.counts_all
    free, used, G, now = pool.free, pool.used, pool.G, sim.now
    cap, cbase = pool.capacity, pool.sum_cbase
    iteration_us = sim.s.cost.iteration_us
    ratio, floor, decay = sim.ratio.current, sim.ratio.min_ratio, sim.ratio.decay_per_step
    t0s, dts, useds, helds, runs, waits = sim.tl
    steps = 0
    while now < arrival and G + 1 < fin_next:
        phase = -G % B
        need = counts_free[phase]
        if need > free:
            break
        free -= need
        used += counts_all[phase]
        dt = iteration_us(0, n, cbase + n * G, 0)
        t0s.append(now)
        dts.append(dt)
        useds.append(used)
        helds.append(cap - free)
        runs.append(n)
        waits.append(0)
        now += dt
        G += 1
        if ratio > floor:
            ratio = max(ratio - decay, floor)
        steps += 1
    if not steps:
        return 0
    pool.free, pool.used, pool.G, sim.now = free, used, G, now
    if ratio != sim.ratio.current:
        sim.ratio = replace(sim.ratio, current=ratio)
    sim.iterations += steps
    sim.c["decode_tokens"] += n * steps
    sim.stalled = 0
    pool.migrate_clipped()
    return steps
