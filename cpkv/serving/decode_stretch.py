"""The serving loop's steady state in straight-line code: decode-only stretches, the requests
that finish inside them, and new arrivals admitted whole.

**Decode-only stretches.** When nothing waits, nothing is being prefilled and requests are
running, the next iterations only decode until something happens: a request arrives (the
loop's *horizon*: the next arrival, or the time an outer driver advances the loop to), or
a step's growth does not fit. :func:`decode_stretch` runs those iterations in a tight
loop over the pool's aggregates and stops *before* the iteration in which one of these
happens. A request that generates its last token finishes inside the stretch, at the end
of that iteration, exactly as a full iteration would finish it (nothing waits, so that
iteration admits nothing): it leaves the running set, and the stretch goes on with the
others. Per iteration the stretch adds the iteration's duration to the clock and nothing
else:

* the duration is the cost model's ``batch_us(0, running, context, 0, 0, 0)``. For the
  linear model (:func:`linear_costs`) it is computed inline, ``a + ctx * context`` with
  ``a = fixed + prefill * 0 + decode * running``: the same float operations, in the same
  order, as :meth:`~cpkv.serving.cost.model.CostModel.iteration_us` (its last term,
  ``+ load * 0``, adds +0.0 to a non-negative number and changes nothing), checked against
  ``batch_us`` when a run starts; a model with a decode form (:func:`decode_form_of`, the
  roofline) is evaluated inline from it; any other model: ``batch_us``, once per iteration;
* the context read grows by ``running`` tokens a step;
* the blocks each step needs come from ``unreserved_by_phase[(-step) % block]`` (the
  blocks it uses from ``running_by_phase``): while ``free // unreserved`` steps fit
  whatever the phase, they are counted once at the end of the stretch, beyond that step by
  step; the first step that does not fit ends the stretch;
* the ratio's decay steps, the timeline's samples (one :class:`~cpkv.serving.iteration_log.
  IterationLog` segment per stretch with a constant running set) and the counters are
  brought up to date once per stretch.

**New arrivals** (``prefill_adder``). When one request waits (or, without policy options,
up to :data:`QUEUE_AT_ONCE`), none admitted before, nothing is being chunked, and the
iteration is the simple kind, it is run here too: the decode step's growth fits, no running
request's remainder drops below 4,096 tokens at this step, SGLang's pass (for one request
:func:`~cpkv.serving.adder.lone_pass`: what :func:`~cpkv.serving.adder.adder_pass` decides
for one candidate; for several ``adder_pass`` itself, on the state the step would leave)
admits every request without cutting it, and no first token needs a preemption. Then the
iteration is applied: the decode step, the ratio's decay, the admissions and prefill, the
first tokens, the duration, the timeline sample, the end (first-token stamps, requests
that generated their last token), and the stretch after it goes on. An arrival at the
horizon is let in (:meth:`~cpkv.serving.loop.Sim._arrive`) and admitted the same way;
anything else returns to the loop's general iteration
(:meth:`~cpkv.serving.loop.Sim._iteration`).

One call (:func:`_steady`) runs such events back to back with the pool's aggregates in
local variables, written back when it returns (and before anything else reads them).
Each iteration is the one the full loop would run, float for float, in the same order,
so results do not depend on it (the tests run every workload both ways).
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Any

from cpkv.serving.adder import adder_pass, lone_pass
from cpkv.serving.cost.model import CostModel
from cpkv.serving.iteration_log import (
    APART,
    FLUSH_BYTES,
    FORM,
    FULL,
    LINEAR,
    LOGGED,
    SEGMENT,
    SEGMENT_FORM,
)
from cpkv.serving.kv_pool import FINISHED, RUNNING
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS as CLIP

QUEUE_AT_ONCE = 8
"""The most waiting requests the straight-line iteration admits at once (a longer queue
goes the general way: there a pass that admits it whole is rare)."""

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
    docstring); returns how many iterations ran. Under ``prefill_adder`` an arrival on the
    way is let in (:meth:`~cpkv.serving.loop.Sim._arrive`) and, when it is the commonest
    kind, admitted in its own iteration (the module docstring), and the stretch goes on; any
    other arrival ends it (the loop's full iteration takes over)."""
    return _steady(sim, False)


def admit_lone_arrival(sim: Any) -> bool:
    """Run the full iteration that admits the waiting requests (at most
    :data:`QUEUE_AT_ONCE`, never admitted before) if it is the simple kind (module
    docstring), then go on as :func:`decode_stretch` does up to ``sim.until_us``; False:
    nothing was changed."""
    waiting = sim.waiting
    if len(waiting) > QUEUE_AT_ONCE or waiting[0].admitted_us is not None:
        return False
    return _steady(sim, True) > 0


def _steady(sim: Any, admit_first: bool) -> int:
    """Admissions of a short queue taken whole, decode stretches and the finishes inside
    them, on the pool's aggregates held in local variables (written back when it returns,
    and before anything else reads them); ``admit_first``: admit ``sim.waiting`` first.
    Returns the iterations run (0: nothing changed)."""
    pool = sim.pool
    now, horizon = sim.now, sim.horizon_us
    if not admit_first and not now < horizon:
        return 0
    lone = sim.lone_fast
    # the pool's aggregates (written back by _write_back)
    n_running, n_unreserved = pool.n_running, pool.n_unreserved
    free, used, step = pool.free_blocks, pool.used_blocks, pool.decode_steps
    context_base_sum = pool.context_base_sum
    n_clipped, n_unclipped = pool.n_clipped, pool.n_unclipped
    unclipped_finish_sum = pool.unclipped_finish_sum
    heap, clip_heap, block, log = pool.finish_heap, pool.clip_heap, pool.block_size, sim.samples
    running_set = pool.running
    running_by_phase, unreserved_by_phase = pool.running_by_phase, pool.unreserved_by_phase
    running_by_step, unreserved_by_step = pool.running_by_step, pool.unreserved_by_step
    linear = sim.linear_costs
    if linear is not None:
        fixed, prefill, decode, ctx_coef, load = linear
    batch_us = sim.settings.cost.batch_us
    budgets = sim.settings.adder
    limits = budgets.lone_limits
    form, forms = sim.decode_form, sim.decode_forms
    durations, records, counts, pack = log.durations, log.records, log.phase_counts, SEGMENT.pack
    pack_form = SEGMENT_FORM.pack
    append = durations.append
    pop, push = heapq.heappop, heapq.heappush
    # the ratio: its decay steps are taken here, written back at the end
    ratio = sim.ratio
    current, floor, decay = ratio.current, ratio.min_ratio, ratio.decay_per_step
    # what a request that ends needs besides the pool (else the loop's finish_decoded)
    extra = sim.extra
    plain = sim.cache is None and extra is None
    done = sim.sink.done
    hit = sim.hit
    waiting = sim.waiting
    arrivals, until = sim.arrivals, sim.until_us
    touch = sim.hits.touch if sim.cache is not None else None
    stamp, jumped = sim.stamp, log.jumped
    # counters, added at the end
    total = decoded = admitted = 0  # decode-only iterations, their tokens, admission iterations
    first_tokens = prefill_tokens = loaded_tokens = l1_hit_tokens = admissions = 0

    admit = admit_first
    while True:
        finishing = None  # requests that generated their last token in the iterations just run
        if admit:  # -- the iteration that admits the queue, whole ------------------------------
            admit = False
            queued = len(waiting)
            r = waiting[0]
            max_new = r.max_new_tokens
            if r.admitted_us is not None or max_new < 1:
                break
            phase = 0
            free_now, step_now = free, step
            if n_running:  # the decode step, tentatively
                phase = -step % block
                need = unreserved_by_phase[phase]
                if need > free or (clip_heap and clip_heap[0][0] <= step + 1):
                    break
                free_now -= need
                step_now += 1
            decays = n_running and current > floor
            ratio_now = (
                (current - decay if current - decay > floor else floor) if decays else current
            )
            headroom = (
                unclipped_finish_sum - n_unclipped * step_now + CLIP * n_clipped
            ) * ratio_now
            if queued == 1:
                device, host = hit(r)
                left = max_new if max_new < CLIP else CLIP
                passed = lone_pass(
                    free_now * block, n_running, headroom, n_running, limits, r.prompt_tokens,
                    device, host, left, left,
                )  # fmt: skip
                if passed is None:
                    break  # not admitted, or cut into chunks
                extend, loaded, stop = passed
                kv = r.prompt_tokens - device
                blocks, first_blocks = -(-kv // block), kv % block == 0
                plan = None
            else:  # several: SGLang's pass over them, when it admits every one whole
                if extra is not None:
                    break  # (a policy may order the queue or preempt for it first)
                planned = _plan(waiting, hit, free_now * block, n_running, headroom, budgets)
                if planned is None:
                    break
                plan, stop = planned
                blocks = first_blocks = 0
                for q, device, _, _ in plan:
                    kv = q.prompt_tokens - device
                    blocks -= -kv // block
                    first_blocks += kv % block == 0
            if free_now - blocks < first_blocks:
                break  # a first token would preempt
            # the iteration: the decode step, the ratio's decay, admission and prefill, the
            # first tokens (a block where a prompt fills its last one)
            running_before = n_running
            finishing = []
            decode_context = 0
            if n_running:
                used += running_by_phase[phase]
                decode_context = context_base_sum + n_running * step
                step = step_now
                while heap and heap[0][0] <= step:
                    _, _, epoch, f = pop(heap)
                    if f.epoch == epoch and f.state == RUNNING:
                        finishing.append(f)
                current = ratio_now
            free = free_now - blocks - first_blocks
            used += blocks + first_blocks
            prefill_tokens_now = prefill_context = pairs = loaded_now = 0
            at_plan = 0
            while True:  # each admitted request (one, unless a plan)
                if plan is not None:
                    r, device, extend, loaded = plan[at_plan]
                    max_new = r.max_new_tokens
                if touch is not None:
                    touch(r)
                filled = device + loaded
                r.device_prefix, r.host_hit = device, loaded
                stamp += 1
                r.stamp = stamp
                r.admitted_us = now
                r.l1_hit, r.l2_hit = device, loaded
                r.filled_tokens = filled + extend
                r.prefilled = extend
                prefill_tokens_now += extend
                prefill_context += filled + extend
                pairs += extend * filled + extend * (extend + 1) // 2
                loaded_now += loaded
                l1_hit_tokens += device
                # it joins the running set (KvPool.join, inline) with its first token
                kv = r.prompt_tokens - device + 1
                r.kv_tokens, r.generated = kv, 1  # (never admitted: nothing reserved)
                r.state = RUNNING
                r.kv_base = kv_base = kv - step
                r.context_base = context_base = kv + device - step
                r.finish_step = finish = step + max_new - 1
                epoch = r.epoch  # (never admitted: never advanced)
                running_set[r] = None
                n_running += 1
                n_unreserved += 1
                phase = kv_base % block
                at = block - 1 - phase
                running_by_phase[phase] += 1
                running_by_step[at] += 1
                running_by_step[at + block] += 1
                unreserved_by_phase[phase] += 1
                unreserved_by_step[at] += 1
                unreserved_by_step[at + block] += 1
                context_base_sum += context_base
                push(heap, (finish, stamp, epoch, r))
                if finish - step > CLIP:
                    n_clipped += 1
                    push(clip_heap, (finish - CLIP, stamp, epoch, r))
                else:
                    n_unclipped += 1
                    unclipped_finish_sum += finish
                if max_new == 1:
                    finishing.append(r)
                at_plan += 1
                if plan is None or at_plan == queued:
                    break
            waiting.clear()
            if stop is not None:
                sim.stop_counts[stop] = sim.stop_counts.get(stop, 0) + 1
            if linear is not None:
                duration = (
                    fixed + prefill * prefill_tokens_now + decode * running_before
                    + ctx_coef * (decode_context + prefill_context) + load * loaded_now
                )  # fmt: skip
            else:
                duration = batch_us(
                    prefill_tokens_now, running_before, decode_context, prefill_context, pairs,
                    loaded_now,
                )  # fmt: skip
            start = now
            now = start + duration
            records += pack(
                FULL, 1, start, n_running, 0, duration, 0, used, free, jumped,
                prefill_tokens_now, running_before, decode_context, prefill_context, pairs,
                loaded_now,
            )  # fmt: skip
            counts.append(0)
            if jumped:  # (only the first segment can follow a jump over idle time)
                jumped = log.jumped = 0.0
            if len(records) >= FLUSH_BYTES:
                log.flush(now)
            decoded += running_before
            first_tokens += queued
            prefill_tokens += prefill_tokens_now
            loaded_tokens += loaded_now
            admissions += queued
            admitted += 1
            if plan is None:
                r.first_token_us = now
            else:
                for r, _, _, _ in plan:
                    r.first_token_us = now
            horizon = arrivals.next_us
            if until < horizon:
                horizon = until
        # -- a decode-only stretch up to the next event ---------------------------------------
        elif now < horizon:
            while heap:
                top = heap[0]
                r = top[3]
                if r.epoch == top[2] and r.state == RUNNING:
                    break
                pop(heap)  # an entry of a request that left
            if not n_running:
                break
            finish_step = heap[0][0]  # the step at which the first request generates its last token
            wanted = finish_step - step  # iterations up to and including that one
            fit = (
                wanted
                if not n_unreserved or free >= n_unreserved * wanted
                else free // n_unreserved
            )
            context = context_base_sum + n_running * step
            start, k = now, 0
            running = n_running
            if linear is not None:
                # fixed + prefill * 0 + decode * running + ctx * (c + 0) + load * 0: the last
                # term adds +0.0 to a non-negative sum, which changes nothing
                kind = LINEAR
                a, ctx = fixed + prefill * 0 + decode * running, ctx_coef
                t1 = t2 = t3 = t4 = 0
                # the context as a float: the same value (exact below 2**53) that ``ctx * c``
                # would convert it to, without converting it every step
                c, step_tokens = float(context), float(running)
                for k in range(1, fit + 1):  # noqa: B007 (now < horizon holds when a stretch starts)
                    now += a + ctx * c
                    if now >= horizon:
                        break
                    c += step_tokens
            elif form is not None:  # batch_us(0, running, c, 0, 0, 0) in its decode form
                terms = forms.get(running)
                if terms is None:
                    terms = forms[running] = form(running)
                head, scale, slope, tail, last = terms
                kind, a, ctx = FORM, head, 0.0
                t1, t2, t3, t4 = scale, slope, tail, last
                c, step_tokens = float(context), float(running)  # (as above)
                for k in range(1, fit + 1):  # noqa: B007
                    now += ((head + scale * (slope * c)) + tail) + last
                    if now >= horizon:
                        break
                    c += step_tokens
            else:
                kind, a, ctx = LOGGED, 0.0, 0.0
                t1 = t2 = t3 = t4 = 0
                while k < fit and now < horizon:
                    duration = batch_us(0, running, context + running * k, 0, 0, 0)
                    append(duration)
                    now += duration
                    k += 1
            if k == fit < wanted and now < horizon:  # near a full pool: step by step
                left = free - _cycle_sum(
                    _phases(unreserved_by_phase, step, min(k, block), block), k
                )
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
                        append(duration)
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
                if n_unreserved == running:  # nothing reserved: what a step needs is what it uses
                    need, needed = None, grown
                else:
                    need = unreserved_by_step[at : at + len(grow)]
                    if k <= block:
                        needed = sum(need)
                    else:
                        needed = k // block * n_unreserved + sum(
                            unreserved_by_step[at : at + k % block]
                        )
                # the stretch's segment and growth counts (cpkv.serving.iteration_log)
                records += (pack_form if kind == FORM else pack)(
                    kind if need is None else kind | APART, k, start, running, 0, a, context,
                    used, free, jumped, t1, t2, t3, t4, 0, 0,
                )  # fmt: skip
                if jumped:
                    jumped = log.jumped = 0.0
                counts.fromlist(grow)
                if need is not None:
                    counts.fromlist(need)
                if len(records) >= FLUSH_BYTES:
                    log.flush(now)
                free -= needed
                used += grown
                step += k
                if current > floor:
                    for _ in range(k):
                        if current <= floor:
                            break
                        current = max(current - decay, floor)
                decoded += running * k
                if clip_heap:  # pool.migrate_clipped(), inline
                    while clip_heap and clip_heap[0][0] <= step:
                        _, _, epoch, r = pop(clip_heap)
                        if r.epoch == epoch and r.state == RUNNING:
                            n_clipped -= 1
                            n_unclipped += 1
                            unclipped_finish_sum += r.finish_step
                total += k
                if k == wanted:  # the request(s) that generated their last token leave
                    finishing = []
                    while heap and heap[0][0] <= finish_step:
                        _, _, epoch, r = pop(heap)
                        if r.epoch == epoch and r.state == RUNNING:
                            finishing.append(r)
            if finishing is None and now < horizon:
                break  # a step whose growth does not fit
        if finishing:  # -- requests that generated their last token leave ---------------------
            if plain:
                for f in finishing:  # KvPool.leave and Sim.finish_decoded, inline
                    advanced = f.advanced_step == step
                    kv = f.kv_base + step + advanced
                    f.generated = f.max_new_tokens - f.finish_step + step + advanced
                    phase = f.kv_base % block
                    at = block - 1 - phase
                    n_running -= 1
                    running_by_phase[phase] -= 1
                    running_by_step[at] -= 1
                    running_by_step[at + block] -= 1
                    if not f.reserved_blocks:
                        unreserved_by_phase[phase] -= 1
                        unreserved_by_step[at] -= 1
                        unreserved_by_step[at + block] -= 1
                        n_unreserved -= 1
                    context_base_sum -= f.context_base
                    if f.finish_step - step > CLIP:
                        n_clipped -= 1
                    else:
                        n_unclipped -= 1
                        unclipped_finish_sum -= f.finish_step
                    f.epoch += 1
                    del running_set[f]
                    blocks = -(-kv // block)
                    reserved = f.reserved_blocks
                    free += blocks if blocks >= reserved else reserved
                    used -= blocks
                    f.reserved_blocks = 0
                    f.state = FINISHED
                    f.finished_us = now
                    done(f)
            else:
                (n_running, n_unreserved, free, used, step, context_base_sum, n_clipped,
                 n_unclipped, unclipped_finish_sum) = _finish_generally(
                    sim, finishing, now, n_running, n_unreserved, free, used, step,
                    context_base_sum, n_clipped, n_unclipped, unclipped_finish_sum,
                )  # fmt: skip
        if finishing is not None and now < horizon:
            continue  # (after an admission or a finish: the next stretch)
        # the horizon: an arrival (let it in), or the time the loop advances to
        if not lone or arrivals.next_us > now or now >= until:
            break
        sim.now = now
        sim._arrive()
        if waiting:
            if len(waiting) > QUEUE_AT_ONCE:
                break
            admit = True  # (its iteration, at the top)
            continue
        horizon = arrivals.next_us
        if until < horizon:
            horizon = until
        if not now < horizon:
            break
    sim.now, sim.horizon_us, sim.stamp = now, horizon, stamp
    _write_back(pool, n_running, n_unreserved, free, used, step, context_base_sum,
                n_clipped, n_unclipped, unclipped_finish_sum)  # fmt: skip
    if current != ratio.current:
        sim.ratio = replace(ratio, current=current)
    counters = sim.counters
    counters["decode_tokens"] += decoded
    if admitted:
        counters["first_tokens"] += first_tokens
        counters["prefill_tokens"] += prefill_tokens
        counters["loaded_tokens"] += loaded_tokens
        counters["admissions"] += admissions
        counters["l1_hit_tokens"] += l1_hit_tokens
    if total or admitted:
        sim.iterations += total + admitted
        sim.stalled = 0
    return total + admitted


def _plan(
    waiting: list[Any], hit: Any, free_tokens: int, running: int, headroom: float, budgets: Any
) -> tuple[list[tuple[Any, int, int, int]], str | None] | None:
    """SGLang's pass (:func:`~cpkv.serving.adder.adder_pass`) over a queue of requests never
    admitted before, when it admits every one whole: ``([(request, device prefix, extend,
    loaded), ...], stop)``; else None."""
    hits, candidates = [], []
    for r in waiting:
        max_new = r.max_new_tokens
        if r.admitted_us is not None or max_new < 1:
            return None
        device, host = found = hit(r)
        hits.append(found)
        clipped = max_new if max_new < CLIP else CLIP
        candidates.append((r.fill_tokens, device, host, clipped, clipped))
    res = adder_pass(free_tokens, running, headroom, running, budgets, None, iter(candidates))
    admitted = res.admitted
    if res.chunk_tokens or len(admitted) != len(waiting) or any(cut for _, _, cut in admitted):
        return None
    plan = [
        (r, found[0], extend, loaded)
        for r, found, (extend, loaded, _) in zip(waiting, hits, admitted, strict=True)
    ]
    return plan, res.stop


def _finish_generally(
    sim: Any, finishing: list[Any], now: float, *aggregates: int
) -> tuple[int, ...]:
    """``sim.finish_decoded`` (a prefix cache to fill, a policy to tell) between the pool's
    aggregates written back from :func:`_steady`'s variables and read again for them."""
    sim.now = now
    pool = sim.pool
    _write_back(pool, *aggregates)
    sim.finish_decoded(finishing, now)
    return (
        pool.n_running, pool.n_unreserved, pool.free_blocks, pool.used_blocks, pool.decode_steps,
        pool.context_base_sum, pool.n_clipped, pool.n_unclipped, pool.unclipped_finish_sum,
    )  # fmt: skip


def _write_back(
    pool: Any, n_running: int, n_unreserved: int, free: int, used: int, step: int,
    context_base_sum: int, n_clipped: int, n_unclipped: int, unclipped_finish_sum: int,
) -> None:  # fmt: skip
    """The pool's aggregates, from :func:`_steady`'s local variables."""
    pool.n_running, pool.n_unreserved = n_running, n_unreserved
    pool.free_blocks, pool.used_blocks, pool.decode_steps = free, used, step
    pool.context_base_sum = context_base_sum
    pool.n_clipped, pool.n_unclipped = n_clipped, n_unclipped
    pool.unclipped_finish_sum = unclipped_finish_sum


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
