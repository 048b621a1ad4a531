"""Iterations in closed form: a stretch between events.

When the scheduler says the coming iterations are quiet
(:class:`~cpkv.serving.schedulers.plan.Quiet`: they admit nothing, preempt nothing and give
each prefilling request a fixed chunk), the engine's state evolves deterministically until
the next event, and :func:`run_stretch` takes all those iterations at once:

* the events that end a stretch: the next arrival, the time an outer driver advances the
  engine to, a cancellation or timeout falling due (``horizon``: no iteration that starts
  at or after it runs here); a running request's last token (the stretch ends with that
  iteration, whose finishes the engine applies); a decode step whose growth does not fit
  (it may preempt: the engine's full iteration takes it); the iteration that completes
  a prompt: the stretch ends with it when every prompt it completes computes a whole
  chunk in it (so it takes the tokens the iterations before it took) and their first
  tokens fit the free blocks (the engine applies them, logs that iteration apart and
  applies its finishes: :meth:`~cpkv.serving.engine.engine.Engine.complete_prompts`),
  else before it (the engine's full iteration takes it); the end of the scheduler's
  quiet steps;
* per iteration: every running request decodes one token (the pool's aggregates advance,
  :meth:`~cpkv.serving.model.kv_pool.KvPool.advance`), every prefilling request computes
  its chunk, SGLang's ratio takes its decay step, the scheduler's stop reason is counted;
* the iterations' durations are the cost model's for arguments that grow by a constant step
  (:mod:`cpkv.serving.cost.stretch`): their sum, and how many start before the horizon,
  come in closed form; the stretch goes to the iteration log as one segment (but an
  iteration that completes prompts: one of its own, as a full iteration's), and its
  durations to the token gaps, each one gap of every running request (each had its token
  before at the end of the iteration before).

The decisions are those of the full iterations it replaces: the same requests admitted,
chunked, preempted and finished in the same iterations; the clock is their durations'
sum, which may differ from adding them one by one in the last bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cpkv.serving.cost.stretch import AffinePieces, Durations, line_steps_within, line_total
from cpkv.serving.model.decode_ahead import decode_steps_ahead
from cpkv.serving.schedulers.plan import FOREVER, NOT_QUIET, Quiet

if TYPE_CHECKING:
    from cpkv.serving.engine.engine import Engine

StretchShape = tuple[int, int, int, int, int]
"""A stretch's first iteration's prefill tokens, decode context, prefill context and
attention pairs, and the pairs' step."""


def decode_stretches(engine: Engine, horizon: float) -> int:
    """With nothing waiting and nothing prefilling (no scheduler has anything to plan), the
    running requests' decode-only iterations up to ``horizon``, stretch after stretch, each
    ending with the iteration in which a request generates its last token (it finishes,
    the next stretch goes on without it, unless a decode side's received requests wait for
    room: the engine then checks its rule); stops before a step whose growth does not fit.
    How many iterations ran."""
    pool, cost, ran = engine.pool, engine.settings.cost, 0
    lines = engine.decode_lines
    now = engine.now
    while now < horizon:
        running = pool.n_running
        if not running:
            break
        step = pool.decode_steps
        wanted = pool.next_finish_step() - step  # iterations up to the next finish
        limit = pool.fitting_steps(wanted)
        if limit <= 0:
            break
        context = pool.context_base_sum + running * step
        stretch = lines.steps_within(running, context, horizon - now, limit)
        if stretch is None:
            break  # (a model whose decode-only durations are not one line)
        k, total, first, slope = stretch
        end = now + total
        grow, need = pool.growth(k)
        engine.samples.stretch(
            now, k, end, running, 0, pool.used_blocks, pool.free_blocks, 0, context, 0, 0, 0,
            grow, need, running, first, slope,
        )  # fmt: skip
        if engine.padded:
            cost.stretch_ran(0, running, context, k, None)
        pool.advance(k)
        engine.ratio = engine.ratio.after_decode_steps(k)
        engine.counters["decode_tokens"] += running * k
        engine.iterations += k
        ran += k
        engine.now = now = end
        if k < wanted:
            break  # the horizon, or a step whose growth does not fit
        for r in pool.finishing():
            pool.leave(r)
            engine.finish(r, end)
        if engine.built is not None and engine.built.queue:
            break  # (a decode side's waiting KV may fit now: the engine checks its rule)
    if ran:
        engine.stalled = 0
    return ran


def decode_line(cost: Any, running: int) -> tuple[float, float] | None:
    """``(intercept, per_context)`` with which a decode-only iteration of ``running``
    requests reading ``context`` tokens takes ``intercept + per_context * context`` (from the
    model's own stretch); None when the model gives no such line."""
    if getattr(type(cost), "stretch", None) is None:
        return None
    durations = cost.stretch(0, running, 0, 0, 0, 0, 0)
    if not isinstance(durations, AffinePieces) or len(durations.pieces) != 1:
        return None
    _, intercept, slope = durations.pieces[0]
    return intercept, slope / running


class DecodeLines:
    """The cost model's decode-only lines (:func:`decode_line`) by the number of running
    requests, each computed once, and the closed-form stretches along them."""

    def __init__(self, cost: Any) -> None:
        self.cost = cost
        self.by_running: dict[int, tuple[float, float] | None] = {}

    def steps_within(
        self, running: int, context: int, budget_us: float, limit: int
    ) -> tuple[int, float, float, float] | None:
        """``running`` requests decode, reading ``context`` tokens at the first step and
        ``running`` more at each next: how many of at most ``limit`` steps start within
        ``budget_us``, their summed duration and the steps' durations ``first + slope j``
        as ``first, slope``; None when the model gives no line."""
        by_running = self.by_running
        if running in by_running:
            line = by_running[running]
        else:
            line = by_running[running] = decode_line(self.cost, running)
        if line is None:
            return None
        intercept, per_context = line
        first, slope = intercept + per_context * context, per_context * running
        steps = line_steps_within(first, slope, budget_us, limit)
        return steps, line_total(first, slope, steps), first, slope


def run_stretch(engine: Engine, horizon: float, bound: float) -> int:
    """Run the quiet iterations from ``engine.now`` up to the next event (module docstring);
    how many ran (0: none, the engine runs a full iteration). ``horizon``: the next event's
    time; ``bound``: the same without the next arrival (an arrival that finds the queue not
    empty joins it inside the stretch when the scheduler's quiet plans read only its head)."""
    pool = engine.pool
    now = engine.now
    if not now < horizon:
        return 0
    quiet = engine.scheduler.quiet(engine)
    if quiet.steps <= 0:
        if not quiet.admits:
            return 0
        quiet = _join_lane(engine)
        if quiet.steps <= 0:
            return 0
    running, step = pool.n_running, pool.decode_steps
    finish = pool.next_finish_step() if running else None
    limit = FOREVER if finish is None else decode_steps_ahead(pool, finish)
    if limit <= 0:
        return 0
    limit = min(limit, quiet.steps)
    prefill = prefill_context = pairs = pairs_step = 0
    lane, completing = engine.lane, -1  # (the iteration whose end completes prompts)
    if engine.prefilling:
        if lane is None or not quiet.uniform:
            return 0
        before, whole = lane.next_due()
        if whole and engine.completes_in_stretch:
            limit, completing = min(limit, before + 1), before
        else:
            limit = min(limit, before)  # (the one completing a prompt: in full)
        chunk, members = lane.chunk, lane.count
        filled = lane.filled_sum()
        prefill = chunk * members
        prefill_context = filled + prefill
        pairs = chunk * filled + members * (chunk * (chunk + 1) // 2)
        pairs_step = members * chunk * chunk
    if limit <= 0 or not (running or prefill):
        return 0
    decode_context = pool.context_base_sum + running * step
    durations = engine.stretch_durations(
        prefill, running, decode_context, prefill_context, pairs, prefill, pairs_step
    )
    absorbs = bound > horizon and engine.arrivals_wait and len(engine.waiting) > 0
    k = durations.steps_within((bound if absorbs else horizon) - now, limit)
    ended, ahead = None, 0  # the prompts the last iteration completes; lane steps taken
    if k == completing + 1:
        assert lane is not None
        lane.advance(k - 1)
        ended, ahead = lane.due_members(), k - 1
        if not engine.first_token_room(ended, pool.free_blocks - pool.needed_blocks(k)):
            ended, k = None, k - 1  # (its first tokens may preempt: in full)
            if not k:
                return 0
    shape: StretchShape = (prefill, decode_context, prefill_context, pairs, pairs_step)
    quiet_steps = k - 1 if ended else k
    waiting = len(engine.waiting)
    joins = _arrivals_within(engine, durations, k, quiet_steps) if absorbs else None
    end = now + durations.total(quiet_steps)
    if quiet_steps:
        _log(engine, durations, now, end, quiet_steps, shape, waiting, joins)
    if engine.padded:
        engine.settings.cost.stretch_ran(prefill, running, decode_context, k, durations)
    _advance(engine, quiet, k, running, prefill)
    if ended:
        end = engine.complete_prompts(ended, end, durations.duration(k - 1), running, shape, k - 1)
    elif prefill:
        assert lane is not None
        lane.advance(k - ahead)
    engine.now = end
    if finish is not None and step + k == finish and not ended:
        for r in pool.finishing():
            pool.leave(r)
            engine.finish(r, end)
    return k


def _join_lane(engine: Engine) -> Quiet:
    """The coming iteration's admissions when each joins the prefill lane with a whole chunk
    (:meth:`~cpkv.serving.schedulers.base.Scheduler.joining`) and that iteration's decode
    step fits: they are admitted now and the iteration is the first of the stretch; the
    scheduler's quiet steps after them (NOT_QUIET: none were admitted)."""
    pool = engine.pool
    if not engine.joins_in_stretch or (pool.n_running and decode_steps_ahead(pool) <= 0):
        return NOT_QUIET
    scheduler = engine.scheduler
    joins = scheduler.joining(engine)
    if not joins:
        return NOT_QUIET
    engine.join_lane(joins)
    quiet = scheduler.quiet(engine)
    if quiet.steps <= 0 or not quiet.uniform:
        raise RuntimeError(
            "internal error: the iteration after admissions that join the lane is not quiet"
        )
    return quiet


def _arrivals_within(engine: Engine, durations: Durations, steps: int, logged: int) -> list[int]:
    """The arrivals that come before the last of the stretch's ``steps`` iterations starts
    join the queue at the start of the first iteration after them (each at least one
    iteration after the one before, as the engine's loop takes them): for each request that
    joins among the first ``logged`` iterations, the iteration it joins at."""
    arrivals, waiting, now = engine.arrivals, engine.waiting, engine.now
    joins: list[int] = []
    last = 0
    while True:
        at = durations.steps_within(arrivals.next_us - now, steps)
        if at >= steps:
            break
        if at <= last:
            at = last + 1
            if at >= steps:
                break
        before = len(waiting)
        engine.now = now + durations.total(at)
        engine.arrive()
        if at < logged:
            joins.extend([at] * (len(waiting) - before))
        last = at
    engine.now = now
    return joins


def _log(
    engine: Engine, durations: Durations, now: float, end: float, k: int, shape: StretchShape,
    waiting: int, joins: list[int] | None,
) -> None:  # fmt: skip
    """The stretch's first ``k`` iterations, from ``now`` to ``end``, into the iteration log
    (one segment; ``waiting`` the queue at its start, ``joins`` the iterations at whose start
    requests join it) and the token gaps."""
    pool = engine.pool
    running = pool.n_running
    prefill, decode_context, prefill_context, pairs, pairs_step = shape
    grow, need = pool.growth(k) if running else ([0], None)
    line, gaps, a, b = False, 0, 0.0, 0.0  # (not one line: its gaps are logged apart)
    if isinstance(durations, AffinePieces) and len(durations.pieces) == 1:
        _, a, b = durations.pieces[0]
        line, gaps = True, running
    engine.samples.stretch(
        now, k, end, running, waiting, pool.used_blocks,
        pool.free_blocks, prefill, decode_context, prefill_context, pairs, pairs_step, grow,
        need, gaps, a, b, joins or None,
    )  # fmt: skip
    if running and not line:
        engine.gaps.stretch(engine.iterations, durations, k, running)


def _advance(engine: Engine, quiet: Quiet, k: int, running: int, prefill: int) -> None:
    """The state after ``k`` quiet iterations (but the clock, the finishes and the lane)."""
    if running:
        engine.pool.advance(k)
        engine.ratio = engine.ratio.after_decode_steps(k)
        engine.stalled = 0
    counters = engine.counters
    counters["decode_tokens"] += running * k
    counters["prefill_tokens"] += prefill * k
    if quiet.stop is not None:
        engine.stop_counts[quiet.stop] = engine.stop_counts.get(quiet.stop, 0) + k
    engine.iterations += k
