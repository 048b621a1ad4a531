"""The serving loop (``admit.mode: serving``): arrivals, iterations, KV, time.

Each iteration (one forward pass), at simulated time ``now``:

1. requests that arrived by ``now`` join the waiting queue; one that could never fit the
   pool even alone (``ceil((prompt + max_new) / block) > capacity_blocks``, or for
   ``prefill_adder`` ``prompt + min(max_new, 4096) + page >= pool tokens``) is rejected,
   reason ``exceeds_kv_capacity``;
2. decode first: every running request generates one token, taking a KV block when its
   length crosses a block boundary; growth that does not fit preempts
   (:mod:`cpkv.serving.kv_pool`);
3. admission and prefill by the policy: ``prefill_adder`` runs one SGLang PrefillAdder
   pass (:mod:`cpkv.serving.adder`), the seed-004 policies their scans and the
   iteration token budget (:mod:`cpkv.serving.block_policies`). An admitted request takes
   blocks for its prompt minus its L1 hit at once, loads its L2 hit back (when at least
   ``load_back_threshold`` tokens) and computes the rest, chunk by chunk;
4. a request whose prompt is complete generates its first token (a block may be needed);
5. the iteration takes :meth:`~cpkv.serving.cost.model.CostModel.batch_us`; at its end
   the tokens are stamped, requests that generated ``max_new_tokens`` tokens finish, free
   their blocks and (trace workloads) insert their prompt blocks into the tiered cache,
   and preempted requests go back to the queue (or are aborted).

When nothing runs and nothing waits, time jumps to the next arrival (SGLang's ratio resets);
when requests only decode, :func:`~cpkv.serving.decode_stretch.decode_stretch` runs the
iterations up to the next arrival in a tight loop, finishing requests on the way (same
results, float for float).
The L1 tier of the prefix cache is modelled as its own partition of device memory: an L1
hit costs no pool blocks and no compute; an L2 hit costs pool blocks and load-back time.
``prefill_adder`` keeps SGLang's adaptive ``new_token_ratio``: after each decode step
(before that iteration's admission) one decay step, or, when the step preempted,
``min(1, (generated + 20 n) / (max_new + 1))`` over the ``n`` requests it kept (their
tokens before the step), as ``retract_decode`` sets it.

A run streams, so that its memory does not grow with its length: requests are built when
they arrive (:mod:`cpkv.serving.arrivals`); a request that finishes or is rejected goes to
the run's sink (:class:`~cpkv.serving.metrics.RequestStats`: its ``requests.jsonl`` line,
its latencies) and is dropped; the iterations' samples go to an
:class:`~cpkv.serving.iteration_log.IterationLog`. :func:`simulate` keeps everything
instead (small runs, tests).

One :class:`Sim` is one serving instance that an outer driver (instances behind a router)
can advance in time order: :meth:`Sim.deliver` hands it a request that has arrived,
:meth:`Sim.advance` runs every iteration that starts before a given time, :meth:`Sim.close`
ends the run. A request delivered at ``t`` joins the queue at the first iteration that
starts at or after ``t``, exactly as in a run that reads its own arrivals (:meth:`Sim.run`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cpkv.admission.token_ratio import NewTokenRatio
from cpkv.core.errors import CpkvError
from cpkv.serving.adder import AdderBudgets, adder_step
from cpkv.serving.arrivals import Arrivals, arrival_order
from cpkv.serving.block_policies import block_step
from cpkv.serving.cost.model import CostModel
from cpkv.serving.decode_stretch import (
    admit_lone_arrival,
    decode_form_of,
    decode_stretch,
    linear_costs,
)
from cpkv.serving.hits import PrefixHits
from cpkv.serving.iteration_log import FLUSH_BYTES, FULL, SEGMENT, Integrals, IterationLog
from cpkv.serving.kv_pool import FINISHED, PREFILL, REJECTED, WAITING, KvPool, Req
from cpkv.serving.workload import ServingRequest
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS

if TYPE_CHECKING:
    from cpkv.serving.policy_options import PolicyOptions

COUNTERS = (
    "prefill_tokens", "decode_tokens", "first_tokens", "loaded_tokens", "l1_hit_tokens", "admissions",
)  # fmt: skip
INF = float("inf")


class SimulationStalled(CpkvError):
    """The serving loop stopped making progress (the message names the cause)."""


@dataclass(frozen=True)
class SimSettings:
    """Everything the loop reads (built from the ``admit`` block by the runner)."""

    policy: str = "prefill_adder"
    block_size: int = 16
    capacity_blocks: int = 1024
    scan: str = "first_fit"
    victim: str = "least_progress"
    on_preempt: str = "requeue"
    budget_tokens: int = 8192
    chunk_tokens: int = 8192
    adder: AdderBudgets = AdderBudgets(16, 16384, 8192)
    ratio: NewTokenRatio = NewTokenRatio()
    cost: CostModel = CostModel()
    stall_iterations: int = 1000
    extra: PolicyOptions | None = None  # issue 13: cpkv.serving.lifecycle (None: all defaults)


@dataclass
class SimResult:
    """One run: its end, iterations, counters and integrals; when kept (:func:`simulate`),
    the requests (input order) and the per-iteration samples too."""

    requests: list[Req] | None
    end_us: float
    iterations: int
    timeline: tuple[list[float], list[float], list[int], list[int], list[int], list[int]] | None
    counters: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[int, str, str, int]] | None = None  # (iteration, rid, what, used blocks)
    # (iteration, decode tokens, prefill tokens, first tokens)
    log: list[tuple[int, int, int, int]] | None = None
    integrals: Integrals = field(default_factory=Integrals)
    samples: IterationLog | None = None  # the samples, to read back (timeline)


class KeepRequests:
    """A sink that keeps every request (``SimResult.requests``)."""

    def __init__(self) -> None:
        self.requests: list[Req] = []

    def done(self, r: Req) -> None:
        self.requests.append(r)

    def in_input_order(self) -> list[Req]:
        return sorted(self.requests, key=lambda r: r.index)


class Sim:
    """One serving instance (see the module docstring); :func:`simulate` runs one whole."""

    def __init__(
        self,
        settings: SimSettings,
        cache: Any = None,
        events: bool = False,
        *,
        sink: Any,
        samples: IterationLog,
        arrivals: Iterable[Req] | None = None,
        trace: Any = None,
    ) -> None:
        s = settings
        self.settings, self.policy, self.cache = s, s.policy, cache
        self.block_size = s.block_size
        self.arrivals = Arrivals(arrivals)
        self.sink, self.samples = sink, samples
        self.pool = KvPool(s.block_size, s.capacity_blocks, s.victim)
        self.log: list[tuple[int, int, int, int]] | None = [] if events else None
        if events:
            self.pool.events = []
        self.waiting: list[Req] = []
        self.prefilling: list[Req] = []
        self.completed: list[Req] = []
        self.chunked: Req | None = None
        self.ratio = s.ratio
        self.budget_tokens, self.chunk_tokens, self.scan = s.budget_tokens, s.chunk_tokens, s.scan
        self.now, self.iterations, self.stamp = 0.0, 0, 0
        self.horizon_us = self.until_us = INF
        self.hits = PrefixHits(cache, s.block_size)
        self.hit = self.hits.hit
        self.scan_version, self.scan_free, self.scan_seen = -1, -1, 0
        self.stop_counts: dict[str, int] = {}
        self.counters: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
        self.counters["preemptions"] = {}
        self.counters["rejects"] = {}
        self.prefill_tokens = self.prefill_context = self.loaded = self.admitted = 0
        self.prefill_attention_pairs = 0
        self.stalled = 0
        self.linear_costs = linear_costs(s.cost)  # the linear model, evaluated inline
        if self.linear_costs is not None:
            samples.context_coef = self.linear_costs[3]
        # any other model with a decode form (roofline): decode stretches evaluate it inline
        self.decode_form = None if self.linear_costs is not None else decode_form_of(s.cost)
        self.decode_forms: dict[int, tuple] = {}  # by running requests
        self._load_threshold = max(1, s.adder.load_back_threshold)
        self.lone_fast = self.policy == "prefill_adder"  # see cpkv.serving.decode_stretch
        # trace events (cpkv.serving.trace_events): every iteration a full one, reported
        self.trace = trace
        if trace is not None:
            self.lone_fast = False
        pool_tokens = s.capacity_blocks * s.block_size
        self._never_blocks = s.capacity_blocks
        self._never_tokens = pool_tokens if self.policy == "prefill_adder" else None
        # issue 13: the admission-policy space (None when every key is a default)
        self.extra = None
        if s.extra is not None:
            from cpkv.serving.lifecycle import Lifecycle

            self.extra = Lifecycle(self, s.extra)

    def admit(self, r: Req, device: int, host: int, reserve: int | None) -> None:
        """``r`` leaves the queue: blocks for its prompt minus its ``device`` prefix, load-back
        of its ``host`` hit (when at least ``load_back_threshold`` tokens)."""
        if self.cache is not None:
            self.hits.touch(r)
        loaded = host if host >= self._load_threshold else 0
        r.state, r.device_prefix, r.host_hit = PREFILL, device, loaded
        r.filled_tokens = device + loaded
        self.stamp = r.stamp = self.stamp + 1
        self.pool.take(r, r.fill_tokens - device, reserve)
        if r.admitted_us is None:
            r.admitted_us = self.now
            r.l1_hit, r.l2_hit = device, loaded
        self.loaded += loaded
        if device:
            self.counters["l1_hit_tokens"] += device
        self.admitted += 1
        if self.extra is not None:  # issue 13
            self.extra.admitted(r, loaded)

    # -- driving it ------------------------------------------------------------------------------
    def deliver(self, r: Req) -> None:
        """``r`` arrived (at ``r.arrival_us``, not before the requests delivered so far); it
        joins the queue at the first iteration that starts at or after its arrival."""
        self.arrivals.deliver(r)

    def run(self) -> SimResult:
        """The whole run (the arrivals given at construction), then :meth:`close`."""
        self.advance(INF)
        return self.close()

    def advance(self, until_us: float) -> None:
        """Run every iteration that starts before ``until_us`` (an idle instance whose next
        arrival is not before ``until_us`` stops at once)."""
        pool, arrivals, extra = self.pool, self.arrivals, self.extra
        while self.now < until_us:
            if arrivals.next_us <= self.now:
                self._arrive()
            if extra is not None:  # issue 13: cancellations and timeouts due now
                extra.before_iteration()
            if not (pool.n_running or self.prefilling or self.waiting or self.chunked):
                upcoming = arrivals.next_us
                if upcoming >= until_us:
                    return
                self.now = max(self.now, upcoming)
                self.ratio = self.ratio.reset()
                self.samples.idle_jump()
                continue
            waiting = self.waiting
            if not (waiting or self.prefilling or self.chunked):
                if pool.n_running and pool.events is None and self.trace is None:
                    # issue 13: a stretch stops at the next cancellation too
                    self.until_us = until_us if extra is None else extra.until(until_us)
                    self.horizon_us = min(arrivals.next_us, self.until_us)
                    if decode_stretch(self):
                        continue  # decode-only iterations ran up to the next arrival
            elif (
                self.lone_fast
                and (len(waiting) == 1 or extra is None)
                and self.chunked is None
                and pool.events is None
            ):
                self.until_us = until_us if extra is None else extra.until(until_us)
                if admit_lone_arrival(self):
                    continue  # the commonest admission (and what follows), in straight-line code
            self._iteration()

    def close(self) -> SimResult:
        """End the run: its counters, its integrals (and what :func:`simulate` keeps)."""
        pool, counters = self.pool, self.counters
        counters["admission_stops"] = dict(sorted(self.stop_counts.items()))
        counters["final_used_blocks"] = pool.used_blocks
        counters["final_free_blocks"] = pool.free_blocks
        counters["final_new_token_ratio"] = self.ratio.current
        integrals = self.samples.close(self.now)
        kept = self.samples.kept
        requests = self.sink.in_input_order() if isinstance(self.sink, KeepRequests) else None
        return SimResult(
            requests, self.now, self.iterations, kept, counters, pool.events, self.log,
            integrals, self.samples,
        )  # fmt: skip

    # -- the loop -------------------------------------------------------------------------------
    def _arrive(self) -> None:
        arrivals, now = self.arrivals, self.now
        block, capacity, tokens = self.block_size, self._never_blocks, self._never_tokens
        while arrivals.next_us <= now:
            r = arrivals.pop()
            prompt, max_new = r.prompt_tokens, r.max_new_tokens
            never = -(-(prompt + max_new) // block) > capacity or (  # ceil_div, inline
                tokens is not None and prompt + min(max_new, CLIP_MAX_NEW_TOKENS) + block >= tokens
            )
            if never:
                self._reject(r, "exceeds_kv_capacity")
                continue
            r.state, r.fill_tokens = WAITING, prompt
            self.waiting.append(r)
            if self.extra is not None:  # issue 13
                self.extra.arrived(r)

    def _reject(self, r: Req, reason: str) -> None:
        r.state, r.reject_reason, r.finished_us = REJECTED, reason, self.now
        rejects = self.counters["rejects"]
        rejects[reason] = rejects.get(reason, 0) + 1
        self._done(r)

    def _done(self, r: Req) -> None:
        self.hits.forget(r)
        if self.extra is not None:  # issue 13
            self.extra.done(r)
        self.sink.done(r)

    def finish_decoded(self, finishing: list[Req], now: float) -> None:
        """Running requests that generated their last token in the iteration that ended at
        ``now`` leave and finish (in the order given)."""
        leave = self.pool.leave
        if self.cache is None and self.extra is None:  # _done's work is the sink's alone
            done = self.sink.done
            for r in finishing:
                leave(r)
                r.state = FINISHED
                r.finished_us = now
                done(r)
            return
        hits = self.hits
        for r in finishing:
            leave(r)
            r.state = FINISHED
            r.finished_us = now
            hits.insert(r)
            self._done(r)

    def _iteration(self) -> None:
        pool, settings = self.pool, self.settings
        if pool.events is not None:
            pool.event_iteration = self.iterations
        running = pool.n_running
        idle = not (running or self.prefilling or self.chunked)
        self.prefill_tokens = self.prefill_context = self.loaded = self.admitted = 0
        self.prefill_attention_pairs = 0
        self.completed = completed = []
        decoded, decode_context, finishing = pool.decode() if running else (0, 0, [])
        if decoded or pool.preempted:
            self._update_ratio()
        if self.extra is not None:  # issue 13: queue order, priority preemption
            self.extra.before_admission(decoded)
        if self.policy == "prefill_adder":
            adder_step(self, decoded)
        else:
            block_step(self, decoded)
        completed = self.completed
        firsts = []
        for k, r in enumerate(completed):
            if r.state != PREFILL:
                continue  # preempted by an earlier first token of this iteration
            if r.generated >= r.max_new_tokens:  # max_new_tokens 0: done without a token
                r.state = FINISHED  # its blocks are freed at the iteration's end (_end)
                finishing.append(r)
                continue
            if pool.grow_first_token(r, completed[k + 1 :] if pool.free_blocks < 1 else ()):
                firsts.append(r)
                pool.join(r, r.kv_tokens)
                if r.generated >= r.max_new_tokens:
                    finishing.append(r)
        if self.extra is not None:  # issue 13: swap traffic, priority victims re-queued
            self.extra.before_duration()
        linear = self.linear_costs
        if linear is not None:  # batch_us of the linear model, inline (see linear_costs)
            fixed, prefill, decode, ctx, load = linear
            duration = (
                fixed
                + prefill * self.prefill_tokens
                + decode * decoded
                + ctx * (decode_context + self.prefill_context)
                + load * self.loaded
            )
        else:
            duration = settings.cost.batch_us(
                self.prefill_tokens,
                decoded,
                decode_context,
                self.prefill_context,
                self.prefill_attention_pairs,
                self.loaded,
            )
        start = self.now
        self.now = now = start + duration
        # the iteration's state: after its allocations, before finishes
        samples = self.samples
        samples.records += SEGMENT.pack(  # a FULL segment
            FULL, 1, start, pool.n_running, len(self.waiting), duration, 0, pool.used_blocks,
            pool.free_blocks, samples.jumped, self.prefill_tokens, decoded, decode_context,
            self.prefill_context, self.prefill_attention_pairs, self.loaded,
        )  # fmt: skip
        samples.phase_counts.append(0)
        samples.jumped = 0.0
        if len(samples.records) >= FLUSH_BYTES:
            samples.flush(now)
        if self.trace is not None:
            self.trace.iteration(self, start, duration, decoded, len(firsts))
        preempted = bool(pool.preempted)
        self._end(now, decoded, firsts, finishing)
        if self.log is not None:
            self.log.append((self.iterations, decoded, self.prefill_tokens, len(firsts)))
        self.iterations += 1
        if decoded or firsts:
            self.stalled = 0
        elif preempted or not (self.prefill_tokens or self.admitted):
            self.stalled += 1
        self._check_progress(idle)
        if self.extra is not None:  # issue 13: the invariants
            self.extra.after_iteration()

    def _end(self, now: float, decoded: int, firsts: list[Req], finishing: list[Req]) -> None:
        pool, counters = self.pool, self.counters
        counters["decode_tokens"] += decoded
        counters["first_tokens"] += len(firsts)
        counters["prefill_tokens"] += self.prefill_tokens
        counters["loaded_tokens"] += self.loaded
        counters["admissions"] += self.admitted
        for r in firsts:  # the token was emitted, even when a later grower preempted r
            if r.first_token_us is None:  # (then r keeps it and recomputes prompt + token later)
                r.first_token_us = now
        for r in finishing:
            if r.state == WAITING:
                continue  # preempted after its last token
            if r.state != FINISHED:
                pool.leave(r)
                r.state = FINISHED
            else:  # max_new_tokens 0: finished without a token, never running
                pool.release_prefill(r)
            r.finished_us = now
            self.hits.insert(r)
            self._done(r)
        preempted = pool.preempted
        if preempted:
            counts = counters["preemptions"]
            for r, phase in preempted:
                key = f"kv_growth_{phase}"
                counts[key] = counts.get(key, 0) + 1
                if self.settings.on_preempt == "abort":
                    self._reject(r, "preempted")
                else:
                    r.fill_tokens = r.prompt_tokens + r.generated
                    r.filled_tokens = r.device_prefix = r.host_hit = r.kv_tokens = 0
                    self.waiting.append(r)
                    if self.extra is not None:  # issue 13
                        self.extra.requeued(r)
            pool.preempted = []

    def _update_ratio(self) -> None:
        """SGLang's adaptive ratio after a decode step: reset by a retraction (the requests
        kept, with the tokens they had before the step), else one decay step."""
        pool, ratio = self.pool, self.ratio
        if pool.preempted:
            kept = [(pool.gen_now(r) - 1, r.max_new_tokens) for r in pool.running_reqs()]
            self.ratio = ratio.retracted(kept)
        elif ratio.current > ratio.min_ratio:
            self.ratio = ratio.decayed()

    def _check_progress(self, idle: bool) -> None:
        if idle and not self.admitted and self.waiting:
            r = self.waiting[0]
            raise SimulationStalled(
                f"admit.mode=serving: no progress at t={self.now / 1000:.3f} ms (iteration "
                f"{self.iterations}): request {r.rid} (prompt {r.fill_tokens}, max_new {r.max_new_tokens}) cannot be "
                f"admitted even into an idle KV pool of {self.settings.capacity_blocks} blocks x {self.block_size} "
                f"tokens by policy {self.policy}; {len(self.waiting)} requests waiting"
            )
        if self.stalled >= self.settings.stall_iterations:
            raise SimulationStalled(
                f"admit.mode=serving: {self.stalled} iterations without a generated token preempted "
                f"or did nothing (a recompute livelock; t={self.now / 1000:.3f} ms; "
                f"{len(self.waiting)} waiting, {self.pool.n_running} running, {self.pool.free_blocks} of "
                f"{self.settings.capacity_blocks} blocks free; policy {self.policy}, victim order "
                f"{self.settings.victim}): try another admit.kv.victim, policy conservative or more KV "
                f"(admit.serving.stall_iterations sets the limit)"
            )


def simulate(
    requests: Sequence[ServingRequest],
    settings: SimSettings,
    cache: Any = None,
    events: bool = False,
) -> SimResult:
    """Run the serving loop on ``requests`` (input order; they arrive at their
    ``arrival_ms``), keeping every request and every iteration's sample in the result;
    ``cache`` is a cold :class:`~cpkv.trace.prefix_cache.TieredPrefixCache` (or None);
    ``events`` records every growth/preemption event and a per-iteration log (slow: every
    decode step goes request by request; for tests)."""
    samples = IterationLog(settings.capacity_blocks, settings.block_size, keep=True)
    sim = Sim(
        settings, cache, events, sink=KeepRequests(), samples=samples,
        arrivals=arrival_order(requests),
    )  # fmt: skip
    return sim.run()
