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
blocks taken per step repeating with the block size, and its durations to the token gaps
(each one gap of every running request; in the first step, of those whose token before
came at the end of the step before, the others' gap reaching back to that token). The decisions are those of the full
steps it replaces; the clock is their durations' sum, which may differ from adding them one
by one in the last bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cpkv.serving.model.request import FINISHED
from cpkv.vllm.decode import DecodeSteps

if TYPE_CHECKING:
    from cpkv.serving.engine.vllm_engine import VllmEngine
    from cpkv.vllm.request import Request


def blocking(stop: str, config: Any) -> bool:
    """Whether decode-only steps keep a full step's admission stop in place (module
    docstring)."""
    return stop == "max_num_seqs" or (stop == "kv_blocks" and config.scheduler_reserve_full_isl)


def decode_stop(engine: VllmEngine, running: int) -> str | None:
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


def decode_stretches(engine: VllmEngine, horizon: float) -> int:
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
        k, total, first, slope = stretch
        end = now + total
        grow = steps.phases[:k]
        gaps = _gaps(engine, steps.running, k, now, first, slope)
        engine.samples.stretch(
            now, k, end, count, len(scheduler.waiting), capacity - free, free, 0, context, 0,
            0, 0, grow, None, gaps, first, slope,
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


def _gaps(
    engine: VllmEngine, running: list[Request], k: int, now: float, first: float, slope: float
) -> int:
    """The token gaps of ``k`` decode-only steps from ``now`` (durations ``first + slope
    j``), and each running request's last token's iteration (the last step's): when every
    running request had its token before at the end of the step before, the gaps each step
    has (the stretch's segment carries them), else 0 and the gaps are logged apart."""
    reqs, gaps, step = engine.reqs, engine.gaps, engine.iterations
    consecutive = 0
    late: dict[float, int] = {}  # the times of tokens before that came earlier
    for request in running:
        r = reqs[request.request_id]
        if r.token_iteration == step - 1:
            consecutive += 1
        else:
            late[r.token_us] = late.get(r.token_us, 0) + 1
        r.token_iteration = step + k - 1
    if consecutive == len(running):
        return consecutive
    if consecutive:
        gaps.point(step, first, consecutive)
    gaps.line(step + 1, first, slope, 1, k, len(running))
    for before, count in late.items():
        gaps.point(-1, now + first - before, count)
    return 0


def _account(
    engine: VllmEngine, running: list[Request], k: int, finished: list[str], end: float
) -> None:
    """The engine's side of ``k`` decode-only steps: tokens, iterations, the finishes."""
    reqs = engine.reqs
    for request in running:
        r = reqs[request.request_id]
        r.generated += k
        r.token_us = end
    counters = engine.counters
    counters["decode_tokens"] += len(running) * k
    engine.iterations += k
    for request_id in finished:
        r = reqs.pop(request_id)
        r.state, r.finished_us = FINISHED, end
        engine.sink.done(r)
