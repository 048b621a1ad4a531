"""The serving engine: one instance's iterations, from arrival to recorded event.

Each iteration (one forward pass), at simulated time ``now``:

1. requests that arrived by ``now`` join the waiting queue (one that could never fit the
   pool even alone is rejected, reason ``exceeds_kv_capacity``: the scheduler's
   :meth:`~cpkv.serving.schedulers.base.Scheduler.never_fits`); due cancellations and
   timeouts end their requests (:mod:`cpkv.serving.engine.lifecycle`);
2. decode first: every running request generates one token, taking a KV block when its
   length crosses a block boundary; growth that does not fit preempts
   (:mod:`cpkv.serving.model.kv_pool`); SGLang's ``new_token_ratio`` takes one decay step
   (or is reset by the preemption);
3. the scheduler (:mod:`cpkv.serving.schedulers`) orders the queue, names requests to
   preempt for waiting ones, and plans the prefill side: the engine applies the
   :class:`~cpkv.serving.schedulers.plan.Plan` row by row: an admitted request takes blocks
   for its prompt minus its L1 hit, loads its L2 hit back (when at least
   ``load_back_threshold`` tokens) and computes its chunk;
4. a request whose prompt is complete generates its first token (a block may be needed);
5. the iteration takes the cost model's ``batch_us`` (:mod:`cpkv.serving.cost`); at its
   end the tokens are stamped, requests that generated ``max_new_tokens`` tokens finish,
   free their blocks and (trace workloads) insert their prompt blocks into the tiered
   cache, and preempted requests go back to the queue (or are aborted). The iteration goes
   to the run's :class:`~cpkv.serving.record.iteration_log.IterationLog`, with its token
   gaps (:mod:`cpkv.serving.model.token_runs`), each ended request to its sink.

When nothing runs and nothing waits, time jumps to the next arrival (SGLang's ratio
resets). Between events the engine asks the scheduler nothing: when it says the coming
iterations are quiet (:meth:`~cpkv.serving.schedulers.base.Scheduler.quiet`), they run in
closed form (:mod:`cpkv.serving.engine.stretch`) up to the next event.

One :class:`Engine` is one serving instance that an outer driver (instances behind a
router) can advance in time order: :meth:`Engine.deliver` hands it a request that has
arrived, :meth:`Engine.advance` runs every iteration that starts before a given time,
:meth:`Engine.close` ends the run. A request delivered at ``t`` joins the queue at the first
iteration that starts at or after ``t``, exactly as in a run that reads its own arrivals.

In a disaggregated deployment an instance is one side (:mod:`cpkv.serving.engine.handoff`):
:meth:`Engine.prefill_only` makes it hand each request off after its first token,
:meth:`Engine.decode_side` makes it take requests whose KV arrives built
(:meth:`Engine.deliver_built`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cpkv.admission.token_ratio import NewTokenRatio
from cpkv.core.errors import CpkvError
from cpkv.serving.cost.stretch import durations_of
from cpkv.serving.engine.handoff import BuiltRequests, HeldKv, receive
from cpkv.serving.engine.instance import Instance, new_counters
from cpkv.serving.engine.lifecycle import Lifecycle
from cpkv.serving.engine.settings import EngineSettings
from cpkv.serving.engine.stretch import DecodeLines, StretchShape, decode_stretches, run_stretch
from cpkv.serving.input.arrivals import Arrivals, Handoffs
from cpkv.serving.model.hits import PrefixHits
from cpkv.serving.model.kv_pool import KvPool
from cpkv.serving.model.prefill_lane import PrefillLane, remove_in_order
from cpkv.serving.model.request import FINISHED, PENDING, PREFILL, WAITING, Req
from cpkv.serving.model.token_runs import run_left, run_restarted, withdraw
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.serving.record.segments import Integrals
from cpkv.serving.schedulers.base import Scheduler, make_scheduler
from cpkv.serving.schedulers.plan import Admit, Plan


class SimulationStalled(CpkvError):
    """The engine stopped making progress (the message names the cause)."""


@dataclass
class EngineResult:
    """One run: its end, iterations, counters, its iteration log; when kept (:func:`simulate
    <cpkv.serving.engine.simulate.simulate>`), the requests (input order), the
    per-iteration samples and their integrals too."""

    requests: list[Req] | None
    end_us: float
    iterations: int
    timeline: tuple[list, ...] | None
    counters: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[int, str, str, int]] | None = None  # (iteration, rid, what, used blocks)
    log: list[tuple[int, int, int, int]] | None = None  # (iteration, decode, prefill, firsts)
    integrals: Integrals = field(default_factory=Integrals)
    samples: Any = None


class Engine(Instance):
    """One serving instance (see the module docstring); ``sink`` takes each ended request,
    ``samples`` each iteration; ``events`` records every growth and preemption event and a
    per-iteration log (every iteration then runs in full); ``trace`` takes each iteration
    for the Chrome trace (likewise)."""

    def __init__(
        self,
        settings: EngineSettings,
        cache: Any = None,
        events: bool = False,
        *,
        sink: Any,
        samples: IterationLog,
        arrivals: Iterable[Req] | None = None,
        trace: Any = None,
    ) -> None:
        s = settings
        self.settings, self.cache, self.sink, self.samples, self.trace = (
            s,
            cache,
            sink,
            samples,
            trace,
        )
        self.arrivals = Arrivals(arrivals)
        self.pool = KvPool(s.block_size, s.capacity_blocks, s.victim)
        self.log: list[tuple[int, int, int, int]] | None = [] if events else None
        if events:
            self.pool.events = []
        self.scheduler = make_scheduler(s)
        self.waiting: deque[Req] = deque()  # (admission takes its head: O(1))
        self.prefilling: list[Req] = []  # admitted, prompt not complete (admission order)
        self.lane: PrefillLane | None = (
            PrefillLane(s.chunk_tokens) if self.scheduler.uses_lane else None
        )
        self.ratio: NewTokenRatio = s.ratio
        self.now, self.iterations, self.stamp, self.stalled = 0.0, 0, 0, 0
        self.hits = PrefixHits(cache, s.block_size)
        self.hit = self.hits.hit
        self.load_threshold = max(1, s.adder.load_back_threshold)
        self.stop_counts: dict[str, int] = {}
        self.counters = new_counters()
        self.prefill_tokens = self.prefill_context = self.prefill_attention_pairs = 0
        self.loaded = self.admitted = 0
        self.lifecycle: Lifecycle | None = None
        self.invariants: Any = None
        self.gaps = samples.gaps
        self.left: list[Req] = []  # requests the scheduler preempted in this iteration
        lifecycle = self._policy_parts(s)  # (read as a local: set by a method call)
        self.fast = not events and trace is None and self.invariants is None
        self.decode_lines = DecodeLines(settings.cost)
        self.stretch_durations = durations_of(settings.cost)
        self.padded = getattr(type(s.cost), "stretch_ran", None) is not None
        # (a stretch may end with an iteration that completes prompts: not when anything
        # but the engine hears of first tokens or prices iterations apart)
        self.completes_in_stretch = lifecycle is None and not self.padded
        # (a stretch takes in arrivals that find the queue not empty: not when anything but
        # the queue hears of an arrival)
        self.arrivals_wait = lifecycle is None and self.scheduler.arrivals_wait
        self.joins_in_stretch = lifecycle is None  # (admissions a stretch may take: joining)
        self.bare = (
            cache is None
            and lifecycle is None
            and self.invariants is None
            and type(self.scheduler).done is Scheduler.done
        )
        self.handoff: Any = None  # prefill only: where a request goes after its first token
        self.held: HeldKv | None = None
        self.handed: list[Req] = []  # this iteration's handoffs
        self.built: BuiltRequests | None = None  # decode side: the receive queue

    def prefill_only(self, handoff: Any) -> None:
        """Hand each request off after its first token: ``handoff(r, now)`` (``now``: the
        end of its iteration) returns when its KV has been sent; its blocks are held until
        then (:mod:`cpkv.serving.engine.handoff`)."""
        self.handoff, self.held = handoff, HeldKv()
        self.completes_in_stretch = False

    def decode_side(self, built: BuiltRequests) -> None:
        """Take requests whose KV arrives built (:meth:`deliver_built`), admitted from
        ``built``'s queue by SGLang's decode-side rule."""
        self.built = built
        self.arrivals = Handoffs()
        self.arrivals_wait = False

    def deliver_built(self, r: Req, landed_us: float) -> None:
        """``r``'s KV (its prompt) and first token land at ``landed_us``."""
        handoffs = self.arrivals
        assert isinstance(handoffs, Handoffs)
        handoffs.deliver(r, landed_us)

    def admit_built(self, r: Req, kv: int) -> None:
        """``r`` (its prompt's KV built elsewhere) takes blocks for ``kv`` tokens and decodes
        from now on; its first token reaches the client now."""
        r.device_prefix = r.host_hit = 0
        r.generated = 1
        r.fill_tokens = r.filled_tokens = r.prompt_tokens
        self.stamp = r.stamp = self.stamp + 1
        self.pool.take(r, kv, None)
        r.first_token_us = r.token_us = self.now
        # (its run of consecutive tokens begins with that token, as if the last iteration made it)
        r.token_iteration, r.run_tokens, r.gap_history = self.iterations - 1, 1, None
        self.pool.join(r, kv)

    def _policy_parts(self, s: EngineSettings) -> Lifecycle | None:
        """The policy options' parts: their lifecycle (returned), a safety margin, swapped
        prefixes' hits, the invariant checks."""
        opts = s.options
        if opts is None:
            return None
        lifecycle = Lifecycle(self, opts)
        self.lifecycle = lifecycle
        self.pool.free_blocks -= opts.safety_margin_blocks
        if opts.swap:
            plain = self.hits.hit
            self.hit = lambda r: lifecycle.hit(r, plain)
        if opts.check_invariants:
            from cpkv.serving.engine.invariants import Invariants

            self.invariants = Invariants(self, opts)
        return lifecycle

    # -- driving it ------------------------------------------------------------------------
    def advance(self, until_us: float) -> None:
        """Run every iteration that starts before ``until_us`` (an idle instance whose next
        arrival is not before ``until_us`` stops at once)."""
        pool, arrivals, lifecycle = self.pool, self.arrivals, self.lifecycle
        held, built = self.held, self.built
        while self.now < until_us:
            if arrivals.next_us <= self.now:
                self.arrive()
            if held is not None and held.next_us <= self.now:
                held.release_due(pool, self.now)
            if built is not None and built.queue:
                built.admit(self)
            if lifecycle is not None:
                lifecycle.before_iteration()
            busy = pool.n_running or self.prefilling
            if not (busy or self.waiting):
                upcoming = arrivals.next_us
                if upcoming >= until_us:
                    return
                self.now = max(self.now, upcoming)
                self.ratio = self.ratio.reset()
                continue
            if busy and self.fast:
                bound = until_us
                if held is not None:
                    bound = min(bound, held.next_us)
                if lifecycle is not None:
                    bound = min(bound, lifecycle.horizon())
                horizon = min(arrivals.next_us, bound)
                if self.waiting or self.prefilling:
                    if run_stretch(self, horizon, bound):
                        continue
                elif decode_stretches(self, horizon):
                    continue
            self._iteration()

    def close(self) -> EngineResult:
        """End the run: its counters, its integrals (and what :func:`simulate` keeps)."""
        pool, counters = self.pool, self.counters
        if self.held is not None:
            self.held.release_all(pool)
        counters["admission_stops"] = dict(sorted(self.stop_counts.items()))
        counters["final_used_blocks"] = pool.used_blocks
        counters["final_free_blocks"] = pool.free_blocks
        counters["final_new_token_ratio"] = self.ratio.current
        self.samples.close(self.now)
        requests = getattr(self.sink, "in_input_order", None)
        return EngineResult(
            requests() if requests is not None else None, self.now, self.iterations,
            self.samples.kept, counters, pool.events, self.log, samples=self.samples,
        )  # fmt: skip

    # -- requests coming and going -----------------------------------------------------------
    def arrive(self) -> None:
        """The requests that arrived by now join the queue (or are rejected)."""
        if self.built is not None:  # the decode side: arrivals join the receive queue
            receive(self)
            return
        arrivals, now, never = self.arrivals, self.now, self.scheduler.never_fits
        while arrivals.next_us <= now:
            r = arrivals.pop()
            if never(r):
                self.reject(r, "exceeds_kv_capacity", now)
                continue
            r.state, r.fill_tokens = WAITING, r.prompt_tokens
            self.waiting.append(r)
            if self.lifecycle is not None:
                self.lifecycle.arrived(r)

    def join_lane(self, joins: list[tuple[Req, Admit]]) -> None:
        """``joins`` (each with its lookup) are admitted at the start of the coming iteration
        and join the prefill lane (:meth:`Scheduler.joining`): a stretch runs that iteration."""
        lane = self.lane
        assert lane is not None
        for r, admit in joins:
            self._admit(r, admit.device_prefix, admit.host_hit, admit.reserve_tokens)
            self.prefilling.append(r)
            lane.join(r)
        self.counters["admissions"] += len(joins)
        self._leave_queue([r for r, _ in joins])

    def ended(self, r: Req) -> None:
        """``r`` reached a terminal state: it is forgotten and goes to the sink (its token
        gaps leave the pool unless it finished)."""
        if r.state != FINISHED and (r.run_tokens >= 0 or r.gap_history):
            withdraw(self.gaps, r)
        self.hits.forget(r)
        self.scheduler.done(r)
        if self.invariants is not None:
            self.invariants.finished(r)
        self.sink.done(r)

    def finish(self, r: Req, now: float) -> None:
        """``r`` generated its last token in the iteration that ended at ``now``."""
        r.state = FINISHED
        r.finished_us = now
        if self.bare:  # (nothing but the sink hears of an end)
            self.sink.done(r)
            return
        self.hits.insert(r)
        self.ended(r)

    def _admit(self, r: Req, device: int, host: int, reserve: int | None) -> None:
        """``r`` leaves the queue: blocks for its prompt minus its ``device`` prefix, load-back
        of its ``host`` hit (when at least ``load_back_threshold`` tokens)."""
        if self.cache is not None:
            self.hits.touch(r)
        loaded = host if host >= self.load_threshold else 0
        r.state, r.device_prefix, r.host_hit = PREFILL, device, loaded
        r.filled_tokens = device + loaded
        self.stamp = r.stamp = self.stamp + 1
        self.pool.take(r, r.fill_tokens - device, reserve)
        if r.admitted_us is None:
            r.admitted_us = self.now
            r.l1_hit, r.l2_hit = device, loaded
        self.loaded += loaded
        self.counters["l1_hit_tokens"] += device
        self.admitted += 1
        if self.invariants is not None:
            self.invariants.admitting(r)
        if self.lifecycle is not None:
            self.lifecycle.admitted(r, loaded)

    # -- one iteration -----------------------------------------------------------------------
    def _iteration(self) -> None:
        pool = self.pool
        if pool.events is not None:
            pool.event_iteration = self.iterations
        idle = not (pool.n_running or self.prefilling)
        self.prefill_tokens = self.prefill_context = self.prefill_attention_pairs = 0
        self.loaded = self.admitted = 0
        decoded, decode_context, finishing = pool.decode() if pool.n_running else (0, 0, [])
        if decoded or pool.preempted:
            self._update_ratio()
        completed = self._apply(self._plan(decoded))
        if idle and self.held is not None and self.held.heap and not self.admitted:
            # nothing fits beside the KV still being sent: wait for its release (or an arrival)
            self.now = max(self.now, min(self.held.next_us, self.arrivals.next_us))
            return
        firsts = self._first_tokens(completed, finishing)
        if self.lifecycle is not None:
            self.lifecycle.before_duration()
        duration = self.settings.cost.batch_us(
            self.prefill_tokens, decoded, decode_context, self.prefill_context,
            self.prefill_attention_pairs, self.loaded,
        )  # fmt: skip
        start = self.now
        self.now = now = start + duration
        # (its one-iteration token gaps: every request that decoded had a token at the last end)
        self.samples.iteration(
            start, duration, pool.n_running, len(self.waiting), pool.used_blocks,
            pool.free_blocks, self.prefill_tokens, decoded, decode_context, self.prefill_context,
            self.prefill_attention_pairs, self.loaded, decoded,
        )  # fmt: skip
        if self.trace is not None:
            self.trace.iteration(self, start, duration, decoded, len(firsts), len(completed))
        preempted = bool(pool.preempted)
        self._end(start, now, decoded, firsts, finishing)
        if self.log is not None:
            self.log.append((self.iterations, decoded, self.prefill_tokens, len(firsts)))
        self.iterations += 1
        if decoded or firsts:
            self.stalled = 0
        elif preempted or not (self.prefill_tokens or self.admitted):
            self.stalled += 1
        self._check_progress(idle)
        if self.invariants is not None:
            self.invariants.check(decoded)

    def _plan(self, decoded: int) -> Plan:
        """The scheduler's order, preemptions and plan for this iteration."""
        scheduler = self.scheduler
        if scheduler.options is not None:
            scheduler.order(self)
            lifecycle = self.lifecycle
            assert lifecycle is not None  # (policy options come with their lifecycle)
            for victims in scheduler.preemptions(self, decoded):
                for victim in victims:
                    lifecycle.preempted(victim, self.pool.leave(victim))
                    self.left.append(victim)
        plan = scheduler.plan(self, decoded)
        if plan.stops:
            counts = self.stop_counts
            for stop in plan.stops:
                counts[stop] = counts.get(stop, 0) + 1
        return plan

    def _apply(self, plan: Plan) -> list[Req]:
        """The plan's admissions, then its prefill rows, in order; the requests whose prompt
        is complete, in prefill order (the prefilling ones, then those just admitted)."""
        admitted = []
        for r, admit in plan.admitted:
            self._admit(r, admit.device_prefix, admit.host_hit, admit.reserve_tokens)
            admitted.append(r)
        lane = self.lane
        held = self.prefilling[-plan.held :] if plan.held else ()
        for r in held:  # (the lane's step passes them by)
            lane.leave(r)
        completed = self._lane_step() if plan.uniform else []
        prefill_tokens = prefill_context = pairs = members = 0
        for row in plan.prefills:
            r, extend = row.request, row.tokens
            if r.lane_token:  # a prefilling request's row (a budget that runs out)
                lane.leave(r)
                members += 1
            filled = r.filled_tokens
            prefill_tokens += extend
            prefill_context += filled + extend
            pairs += extend * filled + extend * (extend + 1) // 2
            r.filled_tokens = filled + extend
            r.prefilled += extend
        self.prefill_tokens += prefill_tokens
        self.prefill_context += prefill_context
        self.prefill_attention_pairs += pairs
        if plan.uniform:
            for r in held:
                if r.filled_tokens < r.fill_tokens:
                    lane.join(r)
                else:
                    completed.append(r)
            prefilling = self.prefilling
            if completed:
                remove_in_order(prefilling, completed)
            for r in admitted:
                if r.filled_tokens >= r.fill_tokens:
                    completed.append(r)
                else:
                    prefilling.append(r)
                    if lane is not None:
                        lane.join(r)
        elif lane is None:
            completed, prefilling = [], []
            for r in (*self.prefilling, *admitted) if admitted else self.prefilling:
                (completed if r.filled_tokens >= r.fill_tokens else prefilling).append(r)
        else:  # the rows' requests left the lane: those still prefilling join it again
            prefilling = self.prefilling
            completed = []
            for r in prefilling[:members] if members else ():
                if r.filled_tokens >= r.fill_tokens:
                    completed.append(r)
                else:
                    lane.join(r)
            if completed:
                kept = [r for r in prefilling[:members] if r.filled_tokens < r.fill_tokens]
                prefilling = kept + prefilling[members:]
            for r in admitted:
                if r.filled_tokens >= r.fill_tokens:
                    completed.append(r)
                else:
                    prefilling.append(r)
                    lane.join(r)
        self.prefilling = prefilling
        if admitted:
            self._leave_queue(admitted)
        return completed

    def _lane_step(self) -> list[Req]:
        """A uniform iteration of the prefilling requests (each computes ``min(left,
        chunk)``): their tokens counted, the lane one step on; those whose prompt it
        completes, in prefill order (they leave the lane)."""
        lane = self.lane
        assert lane is not None
        chunk, due = lane.chunk, lane.due_members()
        lane.settle(due)
        full = lane.count - len(due)  # members computing a whole chunk
        filled_sum = lane.filled_sum()
        tokens, due_filled, due_pairs = chunk * full, 0, 0
        for r in due:
            left, filled = r.fill_tokens - r.filled_tokens, r.filled_tokens
            tokens += left
            due_filled += filled
            due_pairs += left * filled + left * (left + 1) // 2
        self.prefill_tokens += tokens
        self.prefill_context += filled_sum + tokens
        self.prefill_attention_pairs += (
            chunk * (filled_sum - due_filled) + full * (chunk * (chunk + 1) // 2) + due_pairs
        )
        lane.complete(due)
        return list(due)

    def _leave_queue(self, admitted: list[Req]) -> None:
        waiting, n = self.waiting, len(admitted)
        if n == 1 and waiting[0] is admitted[0]:
            waiting.popleft()
        elif all(a is w for a, w in zip(admitted, waiting, strict=False)):
            for _ in range(n):
                waiting.popleft()
        else:
            taken = set(map(id, admitted))
            kept = [r for r in waiting if id(r) not in taken]
            waiting.clear()
            waiting.extend(kept)

    def _first_tokens(self, completed: list[Req], finishing: list[Req]) -> list[Req]:
        """The completed prompts' first tokens (a request asking for none finishes without);
        the requests that generated one."""
        pool, firsts = self.pool, []
        for k, r in enumerate(completed):
            if r.state != PREFILL:
                continue  # preempted by an earlier first token of this iteration
            if r.generated >= r.max_new_tokens:  # max_new_tokens 0: done without a token
                r.state = FINISHED  # its blocks are freed at the iteration's end (_end)
                finishing.append(r)
                continue
            if self.handoff is not None and r.max_new_tokens > 1:  # decoded elsewhere
                firsts.append(r)
                self.handed.append(r)
                continue
            if pool.grow_first_token(r, completed[k + 1 :] if pool.free_blocks < 1 else ()):
                firsts.append(r)
                pool.join(r, r.kv_tokens)
                if r.generated >= r.max_new_tokens:
                    finishing.append(r)
        return firsts

    def _end(
        self, start: float, now: float, decoded: int, firsts: list[Req], finishing: list[Req]
    ) -> None:
        pool, counters = self.pool, self.counters
        counters["decode_tokens"] += decoded
        counters["first_tokens"] += len(firsts)
        counters["prefill_tokens"] += self.prefill_tokens
        counters["loaded_tokens"] += self.loaded
        counters["admissions"] += self.admitted
        iteration = self.iterations
        self._emit(firsts, iteration, now)
        if pool.preempted or self.left:
            for r, _ in pool.preempted:
                run_left(r, iteration, start, now)
            for r in self.left:
                run_left(r, iteration, start, now)
            self.left = []
        self._finish_all(finishing, now)
        if self.handed:
            self._hand_off(now)
        if pool.preempted:
            self._requeue(pool.preempted)
            pool.preempted = []

    def _emit(self, firsts: list[Req], iteration: int, now: float) -> None:
        """``firsts`` got a token (a first one, or the first after a preemption) at the end
        of ``iteration``, at ``now``."""
        gaps = self.gaps
        for r in firsts:  # the token was emitted, even when a later grower preempted r
            if r.first_token_us is None:  # (then r keeps it and recomputes prompt + token later)
                r.first_token_us = now
            else:  # (a token before: it ran, and left its run)
                run_restarted(gaps, r, now)
            r.token_iteration, r.run_tokens = iteration, r.generated

    def _finish_all(self, finishing: list[Req], now: float) -> None:
        """``finishing`` generated their last token in the iteration that ended at ``now``."""
        pool = self.pool
        for r in finishing:
            if r.state == WAITING:
                continue  # preempted after its last token
            if r.state != FINISHED:
                pool.leave(r)
            else:  # max_new_tokens 0: finished without a token, never running
                pool.release_prefill(r)
            self.finish(r, now)

    # -- prompts completed at a stretch's end --------------------------------------------------
    def first_token_room(self, ended: list[Req], free_blocks: int) -> bool:
        """Whether the first tokens of ``ended`` (prompts completed together) fit
        ``free_blocks`` without preempting anyone."""
        block, need = self.pool.block_size, 0
        for r in ended:
            need += r.kv_tokens % block == 0 and not r.reserved_blocks
        return need <= free_blocks

    def complete_prompts(
        self, ended: list[Req], start: float, duration: float, decoded: int, shape: StretchShape,
        j: int,
    ) -> float:  # fmt: skip
        """The last iteration of a stretch (its ``j``-th, from ``start``, taking
        ``duration``, ``decoded`` requests decoding in it; ``shape``: the stretch's first
        cost arguments and steps) completes the prompts of ``ended``, the lane's due
        members, each with a whole chunk: as a full iteration ends (:meth:`_iteration`),
        their first tokens (room for them checked: :meth:`first_token_room`), the
        iteration in the log, the finishes. When it ends."""
        pool = self.pool
        finishing = pool.finishing()
        lane = self.lane
        assert lane is not None
        lane.complete(ended)
        remove_in_order(self.prefilling, ended)
        firsts = self._first_tokens(ended, finishing)
        prefill, decode_context, prefill_context, pairs, pairs_step = shape
        self.samples.iteration(
            start, duration, pool.n_running, len(self.waiting), pool.used_blocks,
            pool.free_blocks, prefill, decoded, decode_context + decoded * j,
            prefill_context + prefill * j, pairs + pairs_step * j, 0, decoded,
        )  # fmt: skip
        now = start + duration
        self.counters["first_tokens"] += len(firsts)
        self._emit(firsts, self.iterations - 1, now)
        self._finish_all(finishing, now)
        return now

    def _hand_off(self, now: float) -> None:
        """This iteration's completed prompts leave for a decode instance: their prompt
        enters this instance's prefix cache, their blocks stay held until the send ends."""
        held, hits = self.held, self.hits
        assert held is not None
        for r in self.handed:
            kv, reserved = r.kv_tokens, r.reserved_blocks
            r.state = PENDING  # (on its way: queued, as the decode side's router sees it)
            r.handoff_us = now
            r.first_token_us = None  # (the client's comes with the decode instance's admission)
            held.hold(self.handoff(r, now), kv, reserved)
            hits.insert(r)
            hits.forget(r)
            self.scheduler.done(r)
        self.handed = []

    def _requeue(self, preempted: list[tuple[Req, str]]) -> None:
        """Growth victims go back to the queue (or are aborted)."""
        counts = self.counters["preemptions"]
        for r, phase in preempted:
            key = f"kv_growth_{phase}"
            counts[key] = counts.get(key, 0) + 1
            if self.settings.on_preempt == "abort":
                self.reject(r, "preempted", self.now)
                continue
            r.fill_tokens = r.prompt_tokens + r.generated
            r.filled_tokens = r.device_prefix = r.host_hit = r.kv_tokens = 0
            self.waiting.append(r)
            if self.lifecycle is not None:
                self.lifecycle.requeued(r)

    def _update_ratio(self) -> None:
        """SGLang's adaptive ratio after a decode step: reset by a retraction (the requests
        kept, with the tokens they had before the step), else one decay step."""
        pool, ratio = self.pool, self.ratio
        if pool.preempted:
            kept = [(pool.gen_now(r) - 1, r.max_new_tokens) for r in pool.running_reqs()]
            self.ratio = ratio.retracted(kept)
        else:
            self.ratio = ratio.after_decode_steps(1)

    def _check_progress(self, idle: bool) -> None:
        if idle and not self.admitted and self.waiting:
            r = self.waiting[0]
            s = self.settings
            raise SimulationStalled(
                f"admit.mode=serving: no progress at t={self.now / 1000:.3f} ms (iteration "
                f"{self.iterations}): request {r.rid} (prompt {r.fill_tokens}, max_new "
                f"{r.max_new_tokens}) cannot be admitted even into an idle KV pool of "
                f"{s.capacity_blocks} blocks x {s.block_size} tokens by policy {s.policy}; "
                f"{len(self.waiting)} requests waiting"
            )
        if self.stalled >= self.settings.stall_iterations:
            s = self.settings
            raise SimulationStalled(
                f"admit.mode=serving: {self.stalled} iterations without a generated token "
                f"preempted or did nothing (a recompute livelock; t={self.now / 1000:.3f} ms; "
                f"{len(self.waiting)} waiting, {self.pool.n_running} running, "
                f"{self.pool.free_blocks} of {s.capacity_blocks} blocks free; policy "
                f"{s.policy}, victim order {s.victim}): try another admit.kv.victim, policy "
                f"conservative or more KV (admit.serving.stall_iterations sets the limit)"
            )
