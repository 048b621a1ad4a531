"""Decode-only steps of a vLLM instance in closed form: a stretch between events.

While every running request decodes and no waiting request can be admitted, the scheduler's
steps are known. Nothing can be admitted when the queue is empty, or when the last full step
refused its head and finished nothing, until a request arrives or finishes:

* for ``max_num_seqs``: the running requests stay as many;
* for ``kv_blocks`` with ``scheduler_reserve_full_isl`` (vLLM's default): what refused it is
  the check that its whole sequence fits, whose blocks needed, less the free blocks, never
  shrink over decode steps (each step takes free blocks; a hit block that leaves the head's
  cached prefix was either taken, freeing nothing, or held, needing one more block). Without
  the reservation it is the check of the step's chunk alone, whose need falls with its
  prefix when the budget caps the chunk: such steps run in full.

:func:`decode_stretches` takes such steps (:class:`~cpkv.vllm.decode.DecodeSteps`)
together, up to the next event:

* the horizon: no step that starts at or after the next arrival (or the time an outer driver
  advances the instance to) runs here;
* a finish: the stretch ends with the step in which a request reaches its end (its blocks
  are freed in running order, as ``update()`` frees them); the next stretch goes on without
  it, or a full step runs when requests wait;
* a step whose blocks do not fit the free queue (it preempts): the full step takes it.

The steps' durations are the cost model's decode-only line (its closed-form stretch,
:func:`~cpkv.serving.engine.stretch.decode_line`): how many start before the horizon and
their sum come in closed form; the stretch goes to the iteration log as one segment, its
blocks taken per step repeating with the block size. The decisions are those of the full
steps it replaces; the clock is their durations' sum, which may differ from adding them one
by one in the last bits.
"""

from __future__ import annotations

from typing import Any

from cpkv.serving.model.request import FINISHED
from cpkv.vllm.decode import DecodeSteps


def blocking(stop: str, config: Any) -> bool:
    """Whether decode-only steps keep a full step's admission stop in place (module
    docstring)."""
    return stop == "max_num_seqs" or (stop == "kv_blocks" and config.scheduler_reserve_full_isl)


def decode_stop(engine: Any, running: int) -> str | None:
    """What stops admission in a decode-only step of ``running`` requests (None: the queue
    is empty, which the engine does not count), as :func:`~cpkv.vllm.scheduler.admission_stop`
    would name it."""
    scheduler = engine.scheduler
    if not len(scheduler.waiting):
        return None
    config = scheduler.config
    if running >= config.max_num_batched_tokens:
        return "token_budget"
    if running >= config.max_active_requests:
        return "max_num_seqs"
    return "kv_blocks"


def decode_stretches(engine: Any, horizon: float) -> int:
    """The instance's decode-only steps from ``engine.now`` up to the next event (module
    docstring), stretch after stretch; how many steps ran (0: a full step comes next)."""
    scheduler = engine.scheduler
    lines = engine.decode_lines
    capacity = engine.settings.capacity_blocks
    now, ran = engine.now, 0
    while now < horizon:
        steps = DecodeSteps.of(scheduler)
        if steps is None:
            break
        count = len(steps.running)
        free = scheduler.free_blocks
        limit = min(steps.to_finish, steps.fitting(free))
        if limit <= 0:
            break
        context = steps.context
        stretch = lines.steps_within(count, context, horizon - now, limit)
        if stretch is None:
            break  # (a model whose decode-only durations are not one line)
        k, total = stretch
        end = now + total
        grow = steps.phases[:k]
        engine.samples.stretch(
            now, k, end, count, len(scheduler.waiting), capacity - free, free, 0, context, 0,
            0, 0, grow, None,
        )  # fmt: skip
        stop = decode_stop(engine, count)
        if stop is not None:
            engine.stop_counts[stop] = engine.stop_counts.get(stop, 0) + k
        finished = steps.run(k)
        _account(engine, steps.running, k, finished, end)
        ran += k
        engine.now = now = end
        if k < limit:
            break  # the horizon, or the next step's blocks do not fit
        if finished and len(scheduler.waiting):
            engine.blocked = False
            break
    return ran


def _account(engine: Any, running: list, k: int, finished: list[str], end: float) -> None:
    """The engine's side of ``k`` decode-only steps: tokens, iterations, the finishes."""
    reqs = engine.reqs
    for request in running:
        reqs[request.request_id].generated += k
    counters = engine.counters
    counters["decode_tokens"] += len(running) * k
    engine.iterations += k
    for request_id in finished:
        r = reqs.pop(request_id)
        r.state, r.finished_us = FINISHED, end
        engine.sink.done(r)
