"""Decode-only stretches of the serving loop, run without the per-iteration machinery.

When nothing waits, nothing is being prefilled and requests are running, the next
iterations only decode until something happens: a request arrives, a request generates
its last token, or a step's growth does not fit. :func:`decode_stretch` runs those
iterations in a tight loop over the pool's aggregates (O(1) per iteration: the blocks the
step needs come from ``unreserved_by_phase[(-step) % block]``, the context read from
``context_base_sum + running * step``) and stops *before* the iteration in which one of these happens, which the full
iteration then handles. Each iteration is the one the full loop would run, float for
float (same cost-model call, same ratio decay steps, same timeline sample), so results do
not depend on it.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Any

from tests.helpers.serving_reference.kv_pool import RUNNING


def decode_stretch(sim: Any) -> int:
    """Run the decode-only iterations from now until the next event; returns how many."""
    pool, order = sim.pool, sim.order
    heap = pool.finish_heap
    while heap and not (heap[0][3].epoch == heap[0][2] and heap[0][3].state == RUNNING):
        heapq.heappop(heap)  # entries of requests that left
    if not heap:
        return 0
    next_finish_step = heap[0][0]
    next_arrival_us = (
        order[sim.next_arrival].arrival_us if sim.next_arrival < len(order) else float("inf")
    )
    running, block = pool.n_running, pool.block_size
    unreserved_by_phase, running_by_phase = pool.unreserved_by_phase, pool.running_by_phase
    free, used, step, now = pool.free_blocks, pool.used_blocks, pool.decode_steps, sim.now
    capacity, context_base_sum = pool.capacity_blocks, pool.context_base_sum
    batch_us = sim.settings.cost.batch_us
    ratio, floor, decay = sim.ratio.current, sim.ratio.min_ratio, sim.ratio.decay_per_step
    starts, durations, used_samples, held_samples, running_samples, waiting_samples = sim.timeline
    iterations = 0
    while now < next_arrival_us and step + 1 < next_finish_step:
        phase = -step % block
        need = unreserved_by_phase[phase]
        if need > free:
            break
        free -= need
        used += running_by_phase[phase]
        duration = batch_us(0, running, context_base_sum + running * step, 0, 0, 0)
        starts.append(now)
        durations.append(duration)
        used_samples.append(used)
        held_samples.append(capacity - free)
        running_samples.append(running)
        waiting_samples.append(0)
        now += duration
        step += 1
        if ratio > floor:
            ratio = max(ratio - decay, floor)
        iterations += 1
    if not iterations:
        return 0
    pool.free_blocks, pool.used_blocks, pool.decode_steps, sim.now = free, used, step, now
    if ratio != sim.ratio.current:
        sim.ratio = replace(sim.ratio, current=ratio)
    sim.iterations += iterations
    sim.counters["decode_tokens"] += running * iterations
    sim.stalled = 0
    pool.migrate_clipped()
    return iterations
