"""The commonest full iteration of a ``prefill_adder`` run, in straight-line code: one new
request waits, nothing is being chunked, and it is admitted whole.

:func:`admit_lone_arrival` first decides, without changing anything, whether the iteration
is that simple: the decode step's growth fits, no running request's remainder drops below
4,096 tokens at this step, SGLang's pass (:func:`~cpkv.serving.adder.lone_pass`: what
:func:`~cpkv.serving.adder.adder_pass` decides for one candidate, on the state the step
would leave) admits the request without cutting it, and its
first token needs no preemption. If so it applies the iteration: the decode step, the
ratio's decay, the admission and prefill, the first token, the duration, the timeline
sample, the end (first-token stamp, requests that generated their last token). Each of
these is what :meth:`cpkv.serving.loop.Sim._iteration` does for such an iteration, in the
same order, so the results are the same (the tests run every workload both ways); any
other iteration returns False untouched and goes the general way.
"""

from __future__ import annotations

import heapq
from typing import Any

from cpkv.serving.adder import lone_pass
from cpkv.serving.iteration_log import FLUSH_BYTES, FULL, SEGMENT
from cpkv.serving.kv_pool import PREFILL, RUNNING
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS as CLIP


def admit_lone_arrival(sim: Any) -> bool:
    """Run the full iteration that admits ``sim.waiting[0]`` (the only waiting request,
    never admitted before) if it is the simple kind (see the module docstring)."""
    r = sim.waiting[0]
    max_new = r.max_new_tokens
    if r.admitted_us is not None or max_new < 1:
        return False
    pool = sim.pool
    block, running, step, free = (
        pool.block_size,
        pool.n_running,
        pool.decode_steps,
        pool.free_blocks,
    )
    phase = need = 0
    if running:  # the decode step, tentatively
        phase = -step % block
        need = pool.unreserved_by_phase[phase]
        clip = pool.clip_heap
        if need > free or (clip and clip[0][0] <= step + 1):
            return False
        free -= need
        step += 1
    ratio = sim.ratio
    current = ratio.current
    decays = running and current > ratio.min_ratio
    if decays:
        current = max(current - ratio.decay_per_step, ratio.min_ratio)
    device, host = sim.hit(r)
    left = max_new if max_new < CLIP else CLIP
    headroom = (
        pool.unclipped_finish_sum - pool.n_unclipped * step + CLIP * pool.n_clipped
    ) * current
    admitted = lone_pass(
        free * block, running, headroom, running, sim.settings.adder,
        (r.prompt_tokens, device, host, left, left),
    )  # fmt: skip
    if admitted is None:
        return False  # not admitted, or cut into chunks
    extend, loaded, stop = admitted
    kv = r.prompt_tokens - device
    blocks = -(-kv // block)
    if kv % block == 0 and free - blocks < 1:
        return False  # the first token would preempt
    # -- the iteration ---------------------------------------------------------------------------
    now = sim.now
    finishing = []
    decode_context = 0
    used = pool.used_blocks
    if running:
        used += pool.running_by_phase[phase]
        decode_context = pool.context_base_sum + running * (step - 1)
        pool.decode_steps = step
        heap = pool.finish_heap
        while heap and heap[0][0] <= step:
            _, _, epoch, f = heapq.heappop(heap)
            if f.epoch == epoch and f.state == RUNNING:
                finishing.append(f)
        if decays:
            sim.ratio = ratio.decayed()
    # admission (Sim.admit) and prefill (adder_step), the first token (grow_first_token: it
    # fits, and takes a block when the prompt fills its last one)
    if sim.cache is not None:
        sim.hits.touch(r)
    filled = device + loaded
    r.state, r.device_prefix, r.host_hit = PREFILL, device, loaded
    sim.stamp = r.stamp = sim.stamp + 1
    first_block = kv % block == 0
    pool.free_blocks = free - blocks - first_block
    pool.used_blocks = used + blocks + first_block
    r.admitted_us = now
    r.l1_hit, r.l2_hit = device, loaded
    r.filled_tokens = filled + extend
    r.prefilled = extend
    prefill_context = filled + extend
    sim.waiting.clear()
    if stop is not None:
        sim.stop_counts[stop] = sim.stop_counts.get(stop, 0) + 1
    r.kv_tokens, r.reserved_blocks, r.generated = kv + 1, 0, 1
    pool.join(r, kv + 1)
    if max_new == 1:
        finishing.append(r)
    pairs = extend * filled + extend * (extend + 1) // 2
    linear = sim.linear_costs
    if linear is not None:
        fixed, prefill, decode, ctx, load = linear
        duration = (
            fixed + prefill * extend + decode * running + ctx * (decode_context + prefill_context)
            + load * loaded
        )  # fmt: skip
    else:
        duration = sim.settings.cost.batch_us(
            extend, running, decode_context, prefill_context, pairs, loaded
        )
    sim.now = end = now + duration
    samples = sim.samples
    samples.records += SEGMENT.pack(
        FULL, 1, now, pool.n_running, 0, duration, 0, pool.used_blocks, pool.free_blocks,
        samples.jumped, extend, running, decode_context, prefill_context, pairs, loaded,
    )  # fmt: skip
    samples.phase_counts.append(0)
    samples.jumped = 0.0
    if len(samples.records) >= FLUSH_BYTES:
        samples.flush(end)
    # the iteration's end (Sim._end)
    counters = sim.counters
    counters["decode_tokens"] += running
    counters["first_tokens"] += 1
    counters["prefill_tokens"] += extend
    counters["loaded_tokens"] += loaded
    counters["admissions"] += 1
    if device:
        counters["l1_hit_tokens"] += device
    r.first_token_us = end
    if finishing:
        sim.finish_decoded(finishing, end)
    sim.iterations += 1
    sim.stalled = 0
    return True
