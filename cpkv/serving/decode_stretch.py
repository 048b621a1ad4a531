"""Decode-only stretches of the serving loop, run without the per-iteration machinery.

When nothing waits, nothing is being prefilled and requests are running, the next
iterations only decode until something happens: a request arrives (the loop's *horizon*:
the next arrival, or the time an outer driver advances the loop to), or a step's growth
does not fit. :func:`decode_stretch` runs those iterations in a tight loop over the pool's
aggregates and stops *before* the iteration in which one of these happens, which the full
iteration then handles. A request that generates its last token finishes inside the
stretch, at the end of that iteration, exactly as a full iteration would finish it
(nothing waits, so that iteration admits nothing): it leaves the running set, and the
stretch goes on with the others.

Per iteration the stretch adds the iteration's duration to the clock and nothing else:

* the duration is the cost model's ``batch_us(0, running, context, 0, 0, 0)``. For the
  linear model (:func:`linear_costs`) it is computed inline, ``a + ctx * context`` with
  ``a = fixed + prefill * 0 + decode * running``: the same float operations, in the same
  order, as :meth:`~cpkv.serving.cost.model.CostModel.iteration_us` (its last term,
  ``+ load * 0``, adds +0.0 to a non-negative number and changes nothing), checked against
  ``batch_us`` when a run starts;
* the context read grows by ``running`` tokens a step;
* the blocks each step needs come from ``unreserved_by_phase[(-step) % block]`` (the
  blocks it uses from ``running_by_phase``): while ``free // unreserved`` steps fit
  whatever the phase, they are counted once at the end of the stretch, beyond that step by
  step; the first step that does not fit ends the stretch;
* the ratio's decay steps, the timeline's samples (one :class:`~cpkv.serving.iteration_log.
  IterationLog` segment per stretch with a constant running set) and the counters are
  brought up to date once per stretch.

Each iteration is the one the full loop would run, float for float, so results do not
depend on it (a test runs every workload both ways).
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Any

from cpkv.serving.cost.model import CostModel
from cpkv.serving.iteration_log import LINEAR, LOGGED
from cpkv.serving.kv_pool import RUNNING

_PROBES = ((1, 0), (1, 1), (3, 7), (17, 123_457), (250, 1_000_003), (4096, 987_654_321))


def linear_costs(cost: Any) -> tuple[float, float, float] | None:
    """``(fixed + prefill * 0, decode, ctx)`` when ``cost`` is the linear
    :class:`~cpkv.serving.cost.model.CostModel` with float coefficients, so that a decode
    step of ``n`` requests reading ``c`` context tokens takes ``(first + decode * n) + ctx * c``,
    exactly ``cost.batch_us(0, n, c, 0, 0, 0)``; else None (durations come from ``batch_us``,
    one call per iteration). The identity is checked on a few probes, so a model whose
    arithmetic changed falls back to ``batch_us`` instead of giving different times."""
    if type(cost) is not CostModel:
        return None
    try:
        fixed, prefill, decode, ctx, load = cost.coefficients()
    except (AttributeError, TypeError, ValueError):
        return None
    if not all(type(v) is float and v >= 0.0 for v in (fixed, prefill, decode, ctx, load)):
        return None
    first = fixed + prefill * 0
    for n, c in _PROBES:
        if (first + decode * n) + ctx * c != cost.batch_us(0, n, c, 0, 0, 0):
            return None
    return first, decode, ctx


def decode_stretch(sim: Any) -> int:
    """Run the decode-only iterations from ``sim.now`` to ``sim.horizon_us`` (see the module
    docstring); returns how many ran."""
    pool, horizon = sim.pool, sim.horizon_us
    now = sim.now
    if not now < horizon:
        return 0
    heap, block, log = pool.finish_heap, pool.block_size, sim.samples
    unreserved_by_phase, running_by_phase = pool.unreserved_by_phase, pool.running_by_phase
    linear = sim.linear_costs
    batch_us = sim.settings.cost.batch_us
    durations = log.durations
    total = 0
    while True:
        while heap and not (heap[0][3].epoch == heap[0][2] and heap[0][3].state == RUNNING):
            heapq.heappop(heap)  # entries of requests that left
        running = pool.n_running
        if not heap or not running:
            break
        finish_step = heap[0][0]  # the step at which the first request generates its last token
        step, free = pool.decode_steps, pool.free_blocks
        wanted = finish_step - step  # iterations up to and including that one
        unreserved = sum(unreserved_by_phase)
        fit = min(wanted, free // unreserved) if unreserved else wanted
        context = pool.context_base_sum + running * step
        start, k = now, 0
        if linear is not None:
            kind, a, ctx = LINEAR, linear[0] + linear[1] * running, linear[2]
            c = context
            while k < fit and now < horizon:
                now += a + ctx * c
                c += running
                k += 1
        else:
            kind, a, ctx = LOGGED, 0.0, 0.0
            while k < fit and now < horizon:
                duration = batch_us(0, running, context + running * k, 0, 0, 0)
                durations.append(duration)
                now += duration
                k += 1
        if k == fit < wanted and now < horizon:  # near a full pool: step by step
            left = free - _phase_sum(unreserved_by_phase, step, k, block)
            while k < wanted and now < horizon:
                need = unreserved_by_phase[-(step + k) % block]
                if need > left:
                    break
                left -= need
                c = context + running * k
                if kind == LINEAR:
                    now += a + ctx * c
                else:
                    duration = batch_us(0, running, c, 0, 0, 0)
                    durations.append(duration)
                    now += duration
                k += 1
        if not k:
            break
        m = min(k, block)
        grow = _phases(running_by_phase, step, m, block)
        need = _phases(unreserved_by_phase, step, m, block)
        log.stretch(kind, k, start, running, a, context, pool.used_blocks, free, grow, need, now)
        pool.free_blocks = free - _cycle_sum(need, k)
        pool.used_blocks += _cycle_sum(grow, k)
        pool.decode_steps = step + k
        sim.now = now
        ratio = sim.ratio
        if ratio.current > ratio.min_ratio:
            current, floor, decay = ratio.current, ratio.min_ratio, ratio.decay_per_step
            for _ in range(k):
                if current <= floor:
                    break
                current = max(current - decay, floor)
            sim.ratio = replace(ratio, current=current)
        sim.iterations += k
        sim.counters["decode_tokens"] += running * k
        sim.stalled = 0
        pool.migrate_clipped()
        total += k
        if k < wanted:
            break  # the horizon, or a step whose growth does not fit
        finishing = []
        while heap and heap[0][0] <= finish_step:
            _, _, epoch, r = heapq.heappop(heap)
            if r.epoch == epoch and r.state == RUNNING:
                finishing.append(r)
        sim.finish_decoded(finishing, now)
        if not now < horizon:
            break
    return total


def _phases(counts: list[int], step: int, m: int, block: int) -> list[int]:
    """``counts[(-(step + j)) % block]`` for ``j < m`` (``m <= block``)."""
    p = -step % block
    seq = counts[p::-1]
    if m > p + 1:
        seq += counts[:p:-1]
    return seq[:m]


def _cycle_sum(seq: list[int], k: int) -> int:
    """The sum over ``k`` steps of counts that repeat every ``len(seq)`` steps (``len(seq)``
    is ``k``, or the block size when ``k`` is larger)."""
    if k <= len(seq):
        return sum(seq)
    whole, rest = divmod(k, len(seq))
    return whole * sum(seq) + sum(seq[:rest])


def _phase_sum(counts: list[int], step: int, k: int, block: int) -> int:
    """``sum(counts[(-(step + j)) % block] for j < k)``."""
    return _cycle_sum(_phases(counts, step, min(k, block), block), k) if k else 0
