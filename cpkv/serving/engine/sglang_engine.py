"""A serving instance under SGLang's scheduler loop (``admit.engine: sglang``).

The decisions are :mod:`cpkv.sglang`'s, the model of SGLang 0.5.23's scheduler loop that the
differential suite checks iteration for iteration against the real one; this engine adds time
around them. Each pass of the loop, at simulated time ``now``:

1. requests that arrived by ``now`` join the queue (when the server is fully idle, time jumps
   to the next arrival); one that can never hold its prompt and a token in the pool, or whose
   prompt reaches the context length, is rejected (``exceeds_kv_capacity``,
   ``exceeds_context_len``); SGLang clips the others' ``max_new_tokens`` to the pool and the
   context;
2. the loop builds the next batch (a prefill batch whenever the ``PrefillAdder`` admits
   something, else a decode of the running batch, retracting when its KV does not fit);
3. the batch is priced by the run's cost model (:mod:`cpkv.serving.cost`): an extend row of
   ``n`` tokens after ``p`` in KV is a prefill chunk (context ``p + n``, attention pairs ``n p
   + n (n + 1) / 2``), a decode row reads the request's KV (its committed tokens); radix-cache
   hits are not computed;
4. its results (processed at once, or a pass later in the overlap loop) stamp each request's
   tokens with the batch's end; a request's first token is its TTFT, its last its finish;
   each token's gap to the request's token before goes to the token gaps
   (:mod:`cpkv.serving.record.token_gaps`): the batch's duration when that token came from
   the pass before, else the time since (a prefill batch that did not decode it, a
   retraction).

The radix cache is SGLang's own, inside the KV pool: trace requests name their prompt tokens by
their ``hash_ids`` (so prompts that share blocks share tokens), other requests share nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from cpkv.admission.cp_limit import cp_limit_broken
from cpkv.serving.cost.stretch import line_total
from cpkv.serving.engine.engine import EngineResult, SimulationStalled
from cpkv.serving.engine.instance import Instance, new_counters
from cpkv.serving.engine.stretch import DecodeLines
from cpkv.serving.input.arrivals import Arrivals
from cpkv.serving.model.request import FINISHED, PREFILL, RUNNING, WAITING, Req
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.sglang import Batch, Loop, LoopConfig
from cpkv.sglang import Req as LoopReq
from cpkv.sglang.loop import DECODE
from cpkv.sglang.tokens import TokenRuns

OWN_TOKENS: Final = 1 << 32
"""Token ids a request owns: ``-(index + 1) * OWN_TOKENS + k`` (prompt or output token ``k``)."""
STRETCH_LIMIT: Final = 1 << 20
"""The most decode passes one closed-form stretch takes."""
IDLE_PASSES: Final = 8
"""Passes in a row that run nothing while the server is not idle before the run stalls."""


@dataclass(frozen=True)
class SglangSettings:
    """What an instance under SGLang's loop reads: its server arguments, the cost model and
    the trace's block size (for ``hash_ids``; None: requests share no prefix)."""

    config: LoopConfig
    cost: Any
    trace_block_tokens: int | None = None

    @property
    def block_size(self) -> int:
        return self.config.page_size

    @property
    def capacity_blocks(self) -> int:
        return self.config.max_total_num_tokens // self.config.page_size


def own_id(r: Req, k: int) -> int:
    """The id of ``r``'s own token ``k`` (of its prompt, then its outputs)."""
    return -(r.index + 1) * OWN_TOKENS + k


def prompt_tokens(r: Req, trace_block: int | None) -> range | TokenRuns:
    """``r``'s prompt as token ids: a trace request's hashed blocks ``h * block + offset``,
    then its own tokens (past its blocks, or all of them), as runs; a request that shares
    nothing is a ``range`` (its outputs continue it)."""
    own = own_id(r, 0)
    hashes = r.hash_ids
    if not hashes or trace_block is None:
        return range(own, own + r.prompt_tokens)
    runs: list[tuple[int, int]] = []
    covered = 0
    for h in hashes:
        if covered >= r.prompt_tokens:
            break
        length = min(trace_block, r.prompt_tokens - covered)
        runs.append((h * trace_block, length))
        covered += length
    runs.append((own + covered, r.prompt_tokens - covered))
    return TokenRuns.of(runs)


class SglangEngine(Instance):
    """One serving instance under SGLang's scheduler loop; the driver interface of
    :class:`~cpkv.serving.engine.engine.Engine` (``deliver``, ``advance``, ``run``, ``close``)."""

    def __init__(
        self, settings: SglangSettings, *, sink: Any, samples: IterationLog,
        arrivals: Iterable[Req] | None = None, stretches: bool = True,
    ) -> None:  # fmt: skip
        self.settings, self.sink, self.samples = settings, sink, samples
        self.gaps = samples.gaps
        self.loop = Loop(settings.config, self)
        self.arrivals = Arrivals(arrivals)
        self.now, self.iterations, self.idle_passes = 0.0, 0, 0
        self.counters = new_counters()
        c = settings.config
        page = c.page_size
        self.never_fits = c.max_total_num_tokens - page - 1  # a paged prompt above it
        self.stretches = stretches
        self.live: dict[int, LoopReq] = {}  # the requests in the loop, by index
        self.decode_lines = DecodeLines(settings.cost)

    # -- what a router reads ----------------------------------------------------------------
    @property
    def waiting(self) -> list[LoopReq]:
        return self.loop.waiting

    def generated_now(self, r: Req) -> int:
        """The tokens ``r`` (running here) generated by the end of the last batch launched
        (in the overlap loop that batch's results are not processed yet)."""
        req = self.live.get(r.index)
        if req is None:
            return r.generated
        queue = self.loop.result_queue
        if queue and req in queue[0].reqs and not req.inflight_middle_chunks:
            return req.output_len + 1
        return req.output_len

    # -- driving it ------------------------------------------------------------------------
    def advance(self, until_us: float) -> None:
        loop, arrivals = self.loop, self.arrivals
        while self.now < until_us:
            if loop.is_fully_idle():
                upcoming = arrivals.next_us
                if upcoming >= until_us:
                    return
                self.now = max(self.now, upcoming)
            if arrivals.next_us <= self.now:
                self._arrive()
            if self.stretches and self._decode_stretch(min(arrivals.next_us, until_us)):
                continue
            if loop.step() is None:
                self._idle_pass()
            else:
                self.idle_passes = 0

    def _decode_stretch(self, horizon: float) -> int:
        """The quiet decode passes before ``horizon`` in closed form (the loop's
        :meth:`~cpkv.sglang.loop.Loop.quiet_decode_passes`; the cost model's decode line);
        how many ran (0: the loop runs the next pass in full)."""
        loop, now = self.loop, self.now
        steps = loop.quiet_decode_passes(STRETCH_LIMIT)
        if steps < 2 or not now < horizon:
            return 0
        reqs = loop.running.reqs
        running = len(reqs)
        context = sum(r.kv_committed for r in reqs) + running  # the first pass's
        stretch = self.decode_lines.steps_within(running, context, horizon - now, steps)
        if stretch is None:
            return 0
        steps, total, first, slope = stretch
        end = now + total
        last_start = now + line_total(first, slope, steps - 1)
        pool, tree = loop.pool, loop.tree
        held = pool.total_pages - pool.free_pages - tree.evictable_size // pool.page
        grow = loop.decode_pages(steps)
        overlap = loop.config.overlap  # (then the last pass's tokens are queued: logged apart)
        self.samples.stretch(
            now, steps, end, running, len(loop.waiting), held, pool.total_pages - held,
            0, context, 0, 0, 0, grow, None, 0 if overlap else running, first, slope,
        )  # fmt: skip
        loop.skip_decode_passes(steps, end, last_start)
        if overlap:
            self.gaps.line(self.iterations, first, slope, 0, steps - 1, running)
        self.counters["decode_tokens"] += running * steps
        self.iterations += steps
        self.now = end
        self.idle_passes = 0
        return steps

    def close(self) -> EngineResult:
        loop = self.loop
        counters = self.counters
        pool = loop.pool
        counters["final_used_blocks"] = pool.total_pages - pool.free_pages
        counters["final_free_blocks"] = pool.free_pages
        counters["final_new_token_ratio"] = loop.ratio
        counters["admission_stops"] = dict(sorted(loop.stops.items()))
        self.samples.close(self.now)
        return EngineResult(None, self.now, self.iterations, None, counters, samples=self.samples)

    def _idle_pass(self) -> None:
        loop = self.loop
        if loop.is_fully_idle():
            self.idle_passes = 0
            return
        self.idle_passes += 1
        if self.idle_passes >= IDLE_PASSES:
            raise SimulationStalled(
                f"admit.engine=sglang: no batch ran for {self.idle_passes} passes at "
                f"t={self.now / 1000:.3f} ms with {len(loop.waiting)} waiting and "
                f"{len(loop.running.reqs)} running ({loop.pool.available()} free KV slots)"
            )

    # -- requests coming -------------------------------------------------------------------
    def _arrive(self) -> None:
        arrivals, now = self.arrivals, self.now
        c = self.settings.config
        page, trace_block = c.page_size, self.settings.trace_block_tokens
        while arrivals.next_us <= now:
            r = arrivals.pop()
            paged = -(-r.prompt_tokens // page) * page
            if paged > self.never_fits:
                self.reject(r, "exceeds_kv_capacity", now)
                continue
            if r.prompt_tokens >= c.context_len:
                self.reject(r, "exceeds_context_len", now)
                continue
            r.state = WAITING
            prompt = prompt_tokens(r, trace_block)
            req = LoopReq(
                r.rid, r.index, prompt, r.max_new_tokens, arrival_us=r.arrival_us,
                priority=r.priority,
                output_token=None if isinstance(prompt, range) else own_id(r, r.prompt_tokens),
            )  # fmt: skip
            req.tag = r
            self.live[r.index] = req
            self.loop.add_request(req)

    # -- the loop's events (a Listener's) ---------------------------------------------------
    def launch(self, batch: Batch) -> None:
        loop, counters = self.loop, self.counters
        start = self.now
        prefill = prefill_context = pairs = loaded = 0
        for req, prefix, extend, host in batch.rows:
            prefill += extend
            prefill_context += prefix + extend
            pairs += extend * prefix + extend * (extend + 1) // 2
            loaded += host
            r: Req = req.tag
            r.state = PREFILL
            if r.admitted_us is None:
                r.admitted_us, r.l1_hit, r.l2_hit = start, prefix - host, host
                counters["l1_hit_tokens"] += prefix - host
                counters["admissions"] += 1
            r.prefilled += extend
        decoding = batch.reqs if batch.mode == DECODE else (batch.decoding or ())
        decoded = len(decoding)
        decode_context = 0
        for req in decoding:
            decode_context += req.kv_committed
        duration = self.settings.cost.batch_us(
            prefill, decoded, decode_context, prefill_context, pairs, loaded
        )
        batch.start_us = start
        self.now = batch.end_us = start + duration
        pool, tree = loop.pool, loop.tree
        free = pool.free_pages + tree.evictable_size // pool.page
        running = decoded if batch.mode == DECODE else decoded + len(loop.running.reqs)
        self.samples.iteration(
            start, duration, running, len(loop.waiting),
            pool.total_pages - free, free, prefill, decoded, decode_context, prefill_context,
            pairs, loaded,
        )  # fmt: skip
        counters["prefill_tokens"] += prefill
        counters["loaded_tokens"] += loaded
        counters["decode_tokens"] += decoded
        self.iterations += 1

    def first_token(self, req: LoopReq, batch: Batch) -> None:
        r: Req = req.tag
        r.first_token_us = batch.end_us
        r.state = RUNNING
        self.counters["first_tokens"] += 1

    def emitted(self, batch: Batch) -> None:
        """Token gaps: one batch duration each (the token before came from the pass just
        before), or the time since the token before."""
        if batch.gaps:
            self.gaps.point(batch.ct - 1, batch.end_us - batch.start_us, batch.gaps)
        late = batch.late
        if not late:
            return
        first = late[0]
        for before in late:
            if before != first:
                break
        else:  # (the usual case: every late token before came at one time)
            self.gaps.point(-1, batch.end_us - first, len(late))
            return
        counts: dict[float, int] = {}
        for before in late:
            counts[before] = counts.get(before, 0) + 1
        for before, count in counts.items():
            self.gaps.point(-1, batch.end_us - before, count)

    def finished(self, req: LoopReq, batch: Batch) -> None:
        r: Req = req.tag
        r.state, r.finished_us, r.generated = FINISHED, batch.end_us, req.output_len
        del self.live[r.index]
        self.sink.done(r)

    def preempted(self, req: LoopReq) -> None:
        r: Req = req.tag
        r.state, r.generated = WAITING, req.output_len
        r.preemptions += 1
        counts = self.counters["preemptions"]
        counts["priority"] = counts.get("priority", 0) + 1

    def retracted(self, req: LoopReq, held_tokens: int) -> None:
        r: Req = req.tag
        r.state, r.generated = WAITING, req.output_len
        r.preemptions += 1
        r.recomputed += held_tokens
        counts = self.counters["preemptions"]
        counts["retract_decode"] = counts.get("retract_decode", 0) + 1


def sglang_settings_from(block: Any, cost: Any, workload: Any, seed: int = 0) -> SglangSettings:
    """The instance's server arguments from the ``admit`` block (``admit.sglang`` and the
    ``PrefillAdder`` keys it shares with cpkv's loop). The pool: ``admit.sglang.max_total_num_tokens``,
    else ``admit.kv``'s tokens plus, when ``admit.workload.cache`` is given, its L1 tokens
    (cpkv's loop keeps them as a partition beside the running requests; SGLang's radix cache
    shares one pool with them); that cache's L2 is the host tier. ``seed`` seeds the ``random``
    order."""
    spec = block.sglang
    page = block.page_size
    l1, l2 = given_cache_tokens(block)
    tokens = spec.max_total_num_tokens
    if tokens is None:
        tokens = block.kv.capacity_blocks * block.kv.block_size + l1
    tokens = tokens // page * page
    context = tokens if spec.context_len is None else spec.context_len
    running = block.max_running_requests
    if running is None:  # SGLang's rule for a pool of `tokens` and a context of `context`
        estimate = max(min(int(tokens / context * 512), 4096), 2048)
        running = max(1, min(estimate, tokens // 2))
    cp = block.cp
    cp_limit = None
    if spec.cp_limits and cp.active:
        cp_limit = partial(
            cp_limit_broken,
            max_requests=cp.max_batch_requests,
            max_extend_tokens=cp.max_total_extend_tokens,
            max_cached_tokens=cp.max_total_cached_tokens,
        )
    host = l2 // page * page if l2 else None
    if spec.enable_hierarchical_cache:
        host = spec.hicache_size_tokens
        if host is None:
            host = int(tokens * spec.hicache_ratio)
        host = host // page * page
    config = LoopConfig(
        cp_limit=cp_limit,
        hicache_tokens=host,
        load_back_threshold=block.load_back_threshold,
        max_total_num_tokens=tokens,
        max_running_requests=running,
        context_len=context,
        chunked_prefill_size=block.chunk_tokens,
        max_prefill_tokens=block.max_prefill_tokens,
        page_size=page,
        enable_mixed_chunk=spec.enable_mixed_chunk,
        overlap=not spec.disable_overlap_schedule,
        disable_radix_cache=spec.disable_radix_cache,
        schedule_policy=block.schedule_policy,
        seed=seed,
        schedule_conservativeness=spec.schedule_conservativeness,
        enable_priority_scheduling=block.enable_priority_scheduling,
        schedule_low_priority_values_first=block.schedule_low_priority_values_first,
        priority_scheduling_preemption_threshold=block.priority_scheduling_preemption_threshold,
        disable_priority_preemption=block.disable_priority_preemption,
        init_new_token_ratio=float(block.new_token_ratio),
        min_new_token_ratio_factor=block.serving.ratio_min_factor,
        new_token_ratio_decay_steps=block.serving.ratio_decay_steps,
    )
    return SglangSettings(config, cost, workload.cache_block_size)


def given_cache_tokens(block: Any) -> tuple[int, int]:
    """``admit.workload.cache``'s L1 and L2 tokens when the config gives the block (the
    schema refused unlimited ones), else ``(0, 0)``: SGLang's defaults, one pool and no host
    tier."""
    cache = block.workload.cache
    if cache == type(block.workload)().cache:
        return 0, 0
    l1, l2 = cache.capacities()
    return l1 or 0, l2 or 0
