"""A serving instance under vLLM's V1 scheduler (``admit.engine: vllm``).

The decisions are :mod:`cpkv.vllm`'s, the model of vLLM 0.32.0's ``Scheduler`` that the
differential suite checks step for step against the real one; this engine adds time around
them. Each step (one forward pass), at simulated time ``now``:

1. requests that arrived by ``now`` are added (``add_request``); one whose prompt reaches
   ``max_model_len`` is rejected (reason ``exceeds_max_model_len``), as vLLM's front end
   refuses it;
2. ``schedule()`` plans the step: running requests first (a decode token each, or their next
   prefill chunk), preempting the last running request (fcfs) or the lowest-priority one when
   a KV allocation does not fit, then waiting requests while budget, blocks and
   ``max_num_seqs`` allow;
3. the step is priced by the run's cost model (:mod:`cpkv.serving.cost`): a row of one token
   past the prompt is a decode row (context: the tokens before it and itself), any other a
   prefill chunk of ``n`` tokens after ``computed`` (context ``computed + n``, attention pairs
   ``n * computed + n (n + 1) / 2``); prefix hits are not computed;
4. at the step's end every request whose scheduled tokens reach its length emits a token
   (its first when its prompt just completed), and those at ``max_tokens`` finish and free
   their blocks (``update_from_output``); a token's gap to the request's token before goes
   to the token gaps (:mod:`cpkv.serving.record.token_gaps`): the step's duration when that
   token came at the end of the step before, else the time since.

A step that schedules nothing (vLLM's empty step after the last finish, or a step whose
running pass preempted the request it was scheduling and ended) takes no time. When
nothing runs and nothing waits, time jumps to the next arrival. The prefix cache is vLLM's
own: its cached blocks live in the KV pool and are evicted LRU as blocks are needed; trace
requests name their blocks by their ``hash_ids``, other requests share nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cpkv.core.errors import ConfigError, InputError
from cpkv.serving.engine.engine import EngineResult, SimulationStalled
from cpkv.serving.engine.instance import Instance, new_counters
from cpkv.serving.engine.stretch import DecodeLines
from cpkv.serving.engine.vllm_stretch import blocking, decode_stretches
from cpkv.serving.input.arrivals import Arrivals
from cpkv.serving.model.request import FINISHED, PREFILL, RUNNING, WAITING, Req
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.vllm.config import SchedulerConfig
from cpkv.vllm.request import NAME_BITS, Request, extend_own_keys, own_keys
from cpkv.vllm.scheduler import Scheduler, StepPlan, admission_stop


@dataclass(frozen=True)
class VllmSettings:
    """What a vLLM instance reads: the scheduler's knobs, the cost model, the trace's block
    size (for ``hash_ids``; None: requests share no prefix)."""

    config: SchedulerConfig
    cost: Any
    trace_block_tokens: int | None = None

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def capacity_blocks(self) -> int:
        """Blocks requests can hold (vLLM keeps block 0 as its null block)."""
        return self.config.num_gpu_blocks - 1

    @property
    def options(self) -> None:
        """No admission-policy options (SGLang's engine's): vLLM's scheduler is its own."""
        return None


class BlockNames:
    """The keys of a serving request's vLLM blocks (:class:`cpkv.vllm.request.BlockNames`).

    A block inside the prompt's trace blocks (``hash_ids``, ``trace_block`` tokens each) holds
    the tokens of the trace blocks it spans: its key is the hash of (the key of the trace
    blocks up to the last it reaches, its end within that one), where a trace block's key
    chains its id to its parent's; two such keys are equal exactly when the prefixes are (up
    to the collisions of a hash kept to 62 bits, :data:`~cpkv.vllm.request.NAME_BITS`). Any
    other block (past the prompt or its trace blocks, or of a request without ``hash_ids``)
    holds tokens no other request holds, and so does every block after it: its key is the
    request's own (:func:`~cpkv.vllm.request.extend_own_keys`)."""

    __slots__ = ("own", "shared", "hashes", "block_size", "trace_block", "_chain")

    def __init__(self, r: Req, block_size: int, trace_block: int | None) -> None:
        self.own = own_keys(r.index)
        hashes = r.hash_ids if trace_block is not None else None
        self.shared = 0
        if hashes:
            self.shared = min(r.prompt_tokens, len(hashes) * trace_block) // block_size
        self.hashes, self.block_size, self.trace_block = hashes, block_size, trace_block
        self._chain: list[int] = []

    def extend(self, keys: list, num_full_blocks: int) -> None:
        i = len(keys)
        shared = min(self.shared, num_full_blocks)
        if i < shared:
            bs, trace = self.block_size, self.trace_block
            chain = self._chain
            last = ((shared * bs) - 1) // trace
            if len(chain) <= last:
                parent = chain[-1] if chain else -1
                for h in self.hashes[len(chain) : last + 1]:
                    parent = hash((parent, h))
                    chain.append(parent)
            for end in range((i + 1) * bs, shared * bs + 1, bs):
                last = (end - 1) // trace
                keys.append(hash((chain[last], end - last * trace)) & NAME_BITS)
        extend_own_keys(keys, self.own, num_full_blocks)


class VllmEngine(Instance):
    """One serving instance under vLLM's scheduler; the driver interface of
    :class:`~cpkv.serving.engine.engine.Engine` (``deliver``, ``advance``, ``run``, ``close``)."""

    def __init__(
        self,
        settings: VllmSettings,
        *,
        sink: Any,
        samples: IterationLog,
        arrivals: Iterable[Req] | None = None,
    ) -> None:
        self.settings, self.sink, self.samples = settings, sink, samples
        self.gaps = samples.gaps
        self.scheduler = Scheduler(settings.config)
        self.arrivals = Arrivals(arrivals)
        self.reqs: dict[str, Req] = {}
        self.now, self.iterations = 0.0, 0
        self.stop_counts: dict[str, int] = {}
        self.counters = new_counters()
        self.fast = True  # decode-only steps in closed form (False: every step in full)
        self.blocked = False  # the last full step's admission stop holds until an event
        self.decode_lines = DecodeLines(settings.cost)

    @property
    def waiting(self) -> Any:
        """The waiting queue (its length: the requests queued in the engine)."""
        return self.scheduler.waiting

    # -- driving it ------------------------------------------------------------------------
    def advance(self, until_us: float) -> None:
        arrivals, scheduler = self.arrivals, self.scheduler
        while self.now < until_us:
            if arrivals.next_us <= self.now:
                self._arrive()
            if not scheduler.has_requests():
                upcoming = arrivals.next_us
                if upcoming >= until_us:
                    return
                self.now = max(self.now, upcoming)
                continue
            if self.fast and (self.blocked or not len(scheduler.waiting)):
                if decode_stretches(self, min(arrivals.next_us, until_us)):
                    continue
            self._step()

    def close(self) -> EngineResult:
        free = self.scheduler.free_blocks
        counters = self.counters
        counters["admission_stops"] = dict(sorted(self.stop_counts.items()))
        counters["final_used_blocks"] = self.settings.capacity_blocks - free
        counters["final_free_blocks"] = free
        self.samples.close(self.now)
        return EngineResult(None, self.now, self.iterations, None, counters, samples=self.samples)

    # -- requests coming and going -----------------------------------------------------------
    def _arrive(self) -> None:
        arrivals, now, s = self.arrivals, self.now, self.settings
        max_model_len = s.config.max_model_len
        while arrivals.next_us <= now:
            r = arrivals.pop()
            if r.prompt_tokens >= max_model_len:
                self.reject(r, "exceeds_max_model_len", now)
                continue
            r.state = WAITING
            request = Request.sized(
                r.rid, r.index, r.prompt_tokens, r.max_new_tokens,
                BlockNames(r, s.block_size, s.trace_block_tokens), r.priority, r.arrival_us,
            )  # fmt: skip
            self.reqs[r.rid] = r
            self.scheduler.add_request(request)
            self.blocked = False  # (the queue, its order or the long-prefill cap changed)

    # -- one step --------------------------------------------------------------------------
    def _step(self) -> None:
        scheduler, reqs, counters = self.scheduler, self.reqs, self.counters
        plan = scheduler.schedule()
        stop = admission_stop(scheduler, plan)
        self.blocked = blocking(stop, scheduler.config)
        if stop != "queue_empty":
            self.stop_counts[stop] = self.stop_counts.get(stop, 0) + 1
        if plan.preempted:
            key = "kv_blocks_running"
            counts = counters["preemptions"]
            counts[key] = counts.get(key, 0) + len(plan.preempted)
            for request_id in plan.preempted:
                r = reqs[request_id]
                r.state, r.preemptions = WAITING, r.preemptions + 1
                r.recomputed = scheduler.requests[request_id].discarded_tokens
        if not plan.total_tokens:  # no forward pass: no time (a preemption is progress)
            if not plan.preempted and (scheduler.running or len(scheduler.waiting)):
                self._stalled()
            scheduler.update(plan)
            return
        start = self.now
        for request, _, computed, _ in plan.admitted:
            r = reqs[request.request_id]
            if r.admitted_us is None:
                r.admitted_us, r.l1_hit, r.l2_hit = start, computed, 0
                counters["l1_hit_tokens"] += computed
            r.state = PREFILL
        counters["admissions"] += len(plan.admitted)
        prefill, decoded, decode_context, prefill_context, pairs, emitting = _priced_rows(plan)
        duration = self.settings.cost.batch_us(
            prefill, decoded, decode_context, prefill_context, pairs, 0
        )
        self.now = end = start + duration
        free = scheduler.free_blocks  # (the step's state as it was scheduled)
        running, waiting = len(scheduler.running), len(scheduler.waiting)
        finished = scheduler.update(plan)
        step = self.iterations
        self.iterations += 1
        if finished:
            self.blocked = False
        firsts = consecutive = 0
        late: dict[float, int] = {}  # the times of tokens before that came earlier
        for request, fill in emitting:
            r = reqs[request.request_id]
            r.prefilled += fill
            if r.token_iteration == step - 1 and r.generated:
                consecutive += 1
            elif r.generated:
                late[r.token_us] = late.get(r.token_us, 0) + 1
            r.generated += 1
            r.token_iteration, r.token_us = step, end
            if r.first_token_us is None:
                r.first_token_us = end
                firsts += 1
            r.state = RUNNING
        self.samples.iteration(
            start, duration, running, waiting, self.settings.capacity_blocks - free, free,
            prefill, decoded, decode_context, prefill_context, pairs, 0, consecutive,
        )  # fmt: skip
        for before, count in late.items():
            self.gaps.point(-1, end - before, count)
        for request_id in finished:
            r = reqs.pop(request_id)
            r.state, r.finished_us = FINISHED, end
            self.sink.done(r)
        counters["prefill_tokens"] += prefill
        counters["decode_tokens"] += decoded
        counters["first_tokens"] += firsts

    def _stalled(self) -> None:
        s = self.settings.config
        raise SimulationStalled(
            f"admit.engine=vllm: a step scheduled nothing at t={self.now / 1000:.3f} ms with "
            f"{len(self.scheduler.running)} running and {len(self.scheduler.waiting)} waiting "
            f"({self.scheduler.free_blocks} of {s.num_gpu_blocks - 1} blocks free)"
        )


def _priced_rows(plan: StepPlan) -> tuple[int, int, int, int, int, list[tuple[Request, int]]]:
    """The step's cost-model inputs, and the requests that emit a token at its end with the
    prefill tokens they computed in it: (prefill tokens, decode rows, decode context, prefill
    context, prefill attention pairs, emitting)."""
    prefill = decoded = decode_context = prefill_context = pairs = 0
    emitting: list[tuple[Request, int]] = []
    for entries in (plan.running, plan.admitted):
        for entry in entries:
            request, n, computed = entry[0], entry[1], entry[2]
            if n == 1 and computed >= request.num_prompt_tokens:
                decoded += 1
                decode_context += computed + 1
                if computed + 1 >= request.num_tokens:
                    emitting.append((request, 0))
                continue
            prefill += n
            prefill_context += computed + n
            pairs += n * computed + n * (n + 1) // 2
            if computed + n >= request.num_tokens:
                emitting.append((request, n))
    return prefill, decoded, decode_context, prefill_context, pairs, emitting


def vllm_settings_from(
    block: Any, cost: Any, workload: Any, requests: Sequence[Any] | None = None
) -> VllmSettings:
    """The vLLM instance's settings from the ``admit`` block (``admit.vllm``, ``admit.kv``
    for a pool of the same tokens) and the workload's requests (``requests`` when they are
    drawn already; ``max_model_len`` when not given)."""
    spec = block.vllm
    size = spec.block_size
    blocks = spec.num_gpu_blocks
    if blocks is None:
        blocks = block.kv.capacity_blocks * block.kv.block_size // size + 1
    longest = spec.max_model_len
    if requests is None and workload.draws is None:
        requests = workload.requests
    if longest is None and requests is None:  # drawn as reached: the whole pool
        longest = (blocks - 1) * size
    elif longest is None:
        longest = max((r.prompt_tokens + r.max_new_tokens for r in requests), default=1)
        longest = -(-longest // size) * size
    need = -(-longest // size)
    if need > blocks - 1:
        raise ConfigError(
            f"admit.vllm: one request of max_model_len={longest} tokens needs {need} blocks of "
            f"{size} tokens, the pool has {blocks - 1} (num_gpu_blocks {blocks}, block 0 is "
            "vLLM's null block): vLLM refuses to start so; raise admit.vllm.num_gpu_blocks (or "
            "admit.kv.capacity_blocks) or lower admit.vllm.max_model_len"
        )
    config = SchedulerConfig(
        num_gpu_blocks=blocks,
        max_model_len=longest,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_num_seqs=spec.max_num_seqs,
        long_prefill_token_threshold=spec.long_prefill_token_threshold,
        enable_prefix_caching=spec.enable_prefix_caching,
        scheduler_reserve_full_isl=spec.scheduler_reserve_full_isl,
        policy=spec.policy,
        block_size=size,
    )
    return VllmSettings(config, cost, workload.cache_block_size)


def check_no_fixed_hits(workload: Any, source: str) -> None:
    """vLLM's hits come from its own prefix cache: requests with fixed L1/L2 hits (prefill-model
    JSONL lines, grid rows) cannot be served by it."""
    for r in workload.requests:
        if r.l1_cached_tokens or r.l2_cached_tokens:
            raise InputError(
                f"{source}: request {r.rid} has fixed cached tokens (l1 {r.l1_cached_tokens}, "
                f"l2 {r.l2_cached_tokens}); the vLLM engine finds hits in its own prefix cache: "
                "give requests without cached tokens, or a trace with hash_ids"
            )
