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
  ``batch_us`` when a run starts (any other model: ``batch_us``, once per iteration);
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
from cpkv.serving.iteration_log import APART, FLUSH_BYTES, FORM, LINEAR, LOGGED, SEGMENT
from cpkv.serving.kv_pool import RUNNING
from cpkv.serving.lone_arrival import admit_lone_arrival

_PROBES = (
    (0, 1, 0, 0, 0, 0), (0, 1, 1, 0, 0, 0), (0, 3, 7, 0, 0, 0), (0, 17, 123_457, 0, 0, 0),
    (0, 250, 1_000_003, 0, 0, 0), (0, 4096, 987_654_321, 0, 0, 0), (1, 0, 0, 1, 1, 0),
    (8192, 7, 99_991, 8192, 33_558_528, 4096), (1023, 0, 0, 5000, 3_000_000, 77),
    (3, 250, 2_000_003, 100_000, 300_000_000, 0), (0, 0, 0, 0, 0, 123_457),
)  # fmt: skip
"""(prefill, decode requests, decode context, prefill context, attention pairs, loaded)"""


def linear_costs(cost: Any) -> tuple[float, float, float, float, float] | None:
    """``(fixed, prefill, decode, ctx, load)`` when ``cost`` is the linear
    :class:`~cpkv.serving.cost.model.CostModel` with float coefficients: then
    ``cost.batch_us(p, d, cd, cp, pairs, l)`` is exactly
    ``fixed + prefill * p + decode * d + ctx * (cd + cp) + load * l`` (the expression of
    :meth:`~cpkv.serving.cost.model.CostModel.iteration_us`, evaluated in the same order),
    which the loop evaluates inline. Else None: every duration comes from ``batch_us``. The
    identity is checked on probes, so a model whose arithmetic changed falls back to
    ``batch_us`` instead of giving other times."""
    if type(cost) is not CostModel:
        return None
    try:
        coefficients = cost.coefficients()
        fixed, prefill, decode, ctx, load = coefficients
    except (AttributeError, TypeError, ValueError):
        return None
    if not all(type(v) is float and 0.0 <= v < float("inf") for v in coefficients):
        return None
    for p, d, cd, cp, pairs, loaded in _PROBES:
        inline = fixed + prefill * p + decode * d + ctx * (cd + cp) + load * loaded
        if inline != cost.batch_us(p, d, cd, cp, pairs, loaded):
            return None
    return fixed, prefill, decode, ctx, load


def decode_form_of(cost: Any) -> Any:
    """``cost.decode_form`` when the model's class defines one (the roofline model) that gives
    ``batch_us(0, running, context, 0, 0, 0)`` float for float as ``((head + scale * (slope *
    context)) + tail) + last`` on probes (else None: every decode duration comes from
    ``batch_us``)."""
    if getattr(type(cost), "decode_form", None) is None:
        return None  # not the model's own (a wrapper that delegates attributes, say)
    form = cost.decode_form
    try:
        for _, running, context, *_ in _PROBES:
            if not running:
                continue
            head, scale, slope, tail, last = form(running)
            inline = ((head + scale * (slope * context)) + tail) + last
            if inline != cost.batch_us(0, running, context, 0, 0, 0):
                return None
    except (AttributeError, TypeError, ValueError):
        return None
    return form


def decode_stretch(sim: Any) -> int:
    """Run the decode-only iterations from ``sim.now`` to ``sim.horizon_us`` (see the module
    docstring); returns how many ran. Under ``prefill_adder`` an arrival on the way is let in
    (:meth:`~cpkv.serving.loop.Sim._arrive`) and, when it is the commonest kind,
    admitted by :func:`~cpkv.serving.lone_arrival.admit_lone_arrival`, and the stretch goes
    on; any other arrival ends it (the loop's full iteration takes over)."""
    pool, horizon = sim.pool, sim.horizon_us
    now = sim.now
    lone = sim.lone_fast
    if not now < horizon:
        return 0
    heap, block, log = pool.finish_heap, pool.block_size, sim.samples
    unreserved_by_phase = pool.unreserved_by_phase
    running_by_step, unreserved_by_step = pool.running_by_step, pool.unreserved_by_step
    linear = sim.linear_costs
    batch_us = sim.settings.cost.batch_us
    form, forms = sim.decode_form, sim.decode_forms
    append = log.durations.append
    durations, records, counts, pack = log.durations, log.records, log.phase_counts, SEGMENT.pack
    pop = heapq.heappop
    clip_heap = pool.clip_heap
    total = decoded = admitted = 0  # decode-only iterations, their tokens, admissions
    while True:
        while heap:
            top = heap[0]
            r = top[3]
            if r.epoch == top[2] and r.state == RUNNING:
                break
            pop(heap)  # an entry of a request that left
        running = pool.n_running
        if not running:
            break
        finish_step = heap[0][0]  # the step at which the first request generates its last token
        step, free = pool.decode_steps, pool.free_blocks
        wanted = finish_step - step  # iterations up to and including that one
        unreserved = pool.n_unreserved
        fit = wanted if not unreserved or free >= unreserved * wanted else free // unreserved
        context = pool.context_base_sum + running * step
        start, k = now, 0
        if linear is not None:
            # fixed + prefill * 0 + decode * running + ctx * (c + 0) + load * 0: the last
            # term adds +0.0 to a non-negative sum, which changes nothing
            kind, a, ctx = LINEAR, linear[0] + linear[1] * 0 + linear[2] * running, linear[3]
            t1 = t2 = t3 = t4 = 0
            c = context
            while k < fit and now < horizon:
                now += a + ctx * c
                c += running
                k += 1
        elif form is not None:  # batch_us(0, running, c, 0, 0, 0) in its decode form
            terms = forms.get(running)
            if terms is None:
                terms = forms[running] = form(running)
            head, scale, slope, tail, last = terms
            kind, a, ctx = FORM, head, 0.0
            t1, t2, t3, t4 = scale, slope, tail, last
            c = context
            while k < fit and now < horizon:
                now += ((head + scale * (slope * c)) + tail) + last
                c += running
                k += 1
        else:
            kind, a, ctx = LOGGED, 0.0, 0.0
            t1 = t2 = t3 = t4 = 0
            while k < fit and now < horizon:
                duration = batch_us(0, running, context + running * k, 0, 0, 0)
                append(duration)
                now += duration
                k += 1
        if k == fit < wanted and now < horizon:  # near a full pool: step by step
            left = free - _cycle_sum(_phases(unreserved_by_phase, step, min(k, block), block), k)
            while k < wanted and now < horizon:
                need = unreserved_by_phase[-(step + k) % block]
                if need > left:
                    break
                left -= need
                c = context + running * k
                if kind == LINEAR:
                    now += a + ctx * c
                elif kind == FORM:
                    now += ((head + scale * (slope * c)) + tail) + last
                else:
                    duration = batch_us(0, running, c, 0, 0, 0)
                    durations.append(duration)
                    now += duration
                k += 1
        if k:
            at = (step - 1) % block  # the step-ordered counts from this step on
            if k <= block:
                grow = running_by_step[at : at + k]
                grown = sum(grow)
            else:
                grow = running_by_step[at : at + block]
                grown = k // block * running + sum(running_by_step[at : at + k % block])
            if unreserved == running:  # nothing reserved: what a step needs is what it uses
                need, needed = None, grown
            else:
                need = unreserved_by_step[at : at + len(grow)]
                if k <= block:
                    needed = sum(need)
                else:
                    needed = k // block * unreserved + sum(unreserved_by_step[at : at + k % block])
            # log.stretch(...), inline
            records += pack(
                kind if need is None else kind | APART, k, start, running, 0, a, context,
                pool.used_blocks, free, log.jumped, t1, t2, t3, t4, 0, 0,
            )  # fmt: skip
            log.jumped = 0.0
            counts.fromlist(grow)
            if need is not None:
                counts.fromlist(need)
            if len(records) >= FLUSH_BYTES:
                log.flush(now)
            pool.free_blocks = free - needed
            pool.used_blocks += grown
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
            decoded += running * k
            if clip_heap:
                pool.migrate_clipped()
            total += k
            if k == wanted:  # the request(s) that generated their last token leave
                finishing = []
                while heap and heap[0][0] <= finish_step:
                    _, _, epoch, r = pop(heap)
                    if r.epoch == epoch and r.state == RUNNING:
                        finishing.append(r)
                sim.finish_decoded(finishing, now)
                if now < horizon:
                    continue
        if now < horizon:
            break  # a step whose growth does not fit
        # the horizon: an arrival (let it in), or the time the loop advances to
        arrivals = sim.arrivals
        if not lone or arrivals.next_us > now or now >= sim.until_us:
            break
        sim._arrive()
        waiting = sim.waiting
        if waiting:
            if len(waiting) != 1 or not admit_lone_arrival(sim):  # (it counts its iteration)
                break
            admitted += 1
        now = sim.now
        horizon = sim.horizon_us = min(arrivals.next_us, sim.until_us)
        if not now < horizon:
            break
    sim.counters["decode_tokens"] += decoded
    if total:
        sim.iterations += total
        sim.stalled = 0
    return total + admitted


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
