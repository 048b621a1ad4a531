"""Config blocks of ``admit.mode: serving``: arrivals, SLOs and the serving engine's options.

The iteration-time model is :class:`cpkv.serving.cost.model.CostModel` (``admit.cost``); the KV
pool is ``admit.kv`` (``block_size`` tokens per block, ``capacity_blocks`` blocks, ``scan``,
``victim``) for every policy.

Rates, speedups and times are bounded next to their types: a Poisson rate in [1e-9, 1e9]
requests/s, a speedup in (0, 1e9], SLOs and timeouts between the clock's 1 µs resolution and
its 2**53 µs range, at most 100,000 timeline buckets; a run whose arrivals reach past that range is refused before it runs
(:mod:`cpkv.serving.engine.clock`). CUDA-graph buckets are at most the requests that can
run at once (checked with ``admit.max_running_requests`` and ``admit.kv`` by the ``admit``
block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from cpkv.core.schema import Range, require
from cpkv.core.schema.limits import CLOCK_LIMIT_S, MAX_TOKENS, TOKENS_WHY, Milliseconds

MIN_RATE_RPS = 1e-9
"""The slowest Poisson rate: a mean gap between arrivals of 1e9 s (31.7 years), within the
clock's 2**53 µs."""
MAX_RATE_RPS = 1e9
MAX_SPEEDUP = 1e9
MAX_STALL_ITERATIONS = 10**9
MAX_TIMELINE_POINTS = 100_000
"""The most buckets of ``timeline.jsonl``: each holds about 1.8 KB until the run ends (180 MB
an instance at this bound), and 100,000 is 13 times the 7,680 pixels across an 8K screen,
finer than any plot of it."""
RateRps = Annotated[
    float,
    Range(
        MIN_RATE_RPS, MAX_RATE_RPS,
        why="a request every nanosecond, 1000 per tick of the 1 µs clock: beyond any front end",
        low_why="a mean gap of 1e9 s between arrivals; the float64 µs clock resolves 1 µs "
        f"only up to 2**53 µs ({CLOCK_LIMIT_S:.4g} s)",
    ),
]  # fmt: skip
Speedup = Annotated[
    float,
    Range(0, MAX_SPEEDUP, low_open=True, why="a billion times the trace's own rate"),
]


@dataclass(frozen=True)
class ArrivalsSpec:
    """``admit.arrivals``: when requests arrive.

    * ``trace``: each request's own time (trace ``timestamp``, JSONL ``arrival_ms``; 0 for
      sources without times), divided by ``speedup`` (2 = twice the load);
    * ``poisson``: a Poisson process of ``rate_rps`` requests per second, in queue order,
      drawn from ``random.Random(seed)`` (the experiment's top-level ``seed``);
    * ``zero``: every request at time 0.
    """

    process: Literal["trace", "poisson", "zero"] = "trace"
    rate_rps: RateRps = 1.0
    speedup: Speedup = 1.0


@dataclass(frozen=True)
class SloSpec:
    """``admit.slo``: a request meets the SLO when its TTFT and its TPOT are within these
    (``null``: no limit). Requests with one output token have no TPOT and meet that part."""

    ttft_ms: Milliseconds | None = None
    tpot_ms: Milliseconds | None = None

    def met(self, ttft_ms: float | None, tpot_ms: float | None) -> bool:
        """Whether a finished request with these latencies meets the SLO."""
        if self.ttft_ms is not None and (ttft_ms is None or ttft_ms > self.ttft_ms):
            return False
        return self.tpot_ms is None or tpot_ms is None or tpot_ms <= self.tpot_ms


@dataclass(frozen=True)
class ServingSpec:
    """``admit.serving``: options of the serving engine.

    * ``on_preempt``: ``requeue`` (recompute: the victim frees its KV and waits again at the
      back of the queue, its prompt now holding the tokens it generated), ``swap`` (cpkv's:
      the victim's KV is copied to host memory and back when it is admitted again, both
      ways at ``admit.cost``'s load bandwidth, instead of being recomputed) or ``abort``
      (the victim ends, rejected with reason ``preempted``);
    * ``queue_timeout_ms``: a request that has waited this long in the queue (since it last
      entered it) leaves it, terminal state ``timed_out`` (null: never);
    * ``check_invariants``: assert the block model's invariants after every iteration
      (:mod:`cpkv.serving.engine.invariants`; slow: every iteration runs in full);
    * ``cuda_graph_buckets``: batch sizes of the captured decode CUDA graphs; a decode-only
      iteration is padded to the next one and pays the padding's decode time (empty: none);
    * ``policy_metrics``: add the admission-policy metrics (timeouts, cancellations, swap
      bytes, longest wait, ...) to ``results.json``; on whenever a cpkv policy feature is;
    * ``stall_iterations``: a run ends with an error once this many iterations preempted
      or did no work at all since the last generated token (a recompute livelock: every
      prefill preempted before its first token);
    * ``timeline_points``: buckets of the KV-utilisation timeline (``timeline.jsonl``);
    * ``ratio_min_factor``, ``ratio_decay_steps``: SGLang's adaptive ``new_token_ratio``
      (policy ``prefill_adder``; it starts at ``admit.new_token_ratio``);
    * ``trace_events``: write ``trace.json``, the run's timeline in the Chrome trace-event
      format (:mod:`cpkv.serving.record.trace.events`; Perfetto, chrome://tracing).
    """

    on_preempt: Literal["requeue", "swap", "abort"] = "requeue"
    stall_iterations: Annotated[
        int,
        Range(
            1,
            MAX_STALL_ITERATIONS,
            why="a livelock runs this many iterations before it is reported",
        ),
    ] = 1000
    queue_timeout_ms: Milliseconds | None = None
    check_invariants: bool = False
    cuda_graph_buckets: tuple[Annotated[int, Range(1, MAX_TOKENS, why=TOKENS_WHY)], ...] = ()
    policy_metrics: bool = False
    timeline_points: Annotated[
        int,
        Range(
            1,
            MAX_TIMELINE_POINTS,
            why="about 1.8 KB a bucket held until the run ends; 13x the pixels across an 8K screen",
        ),
    ] = 200
    ratio_min_factor: Annotated[
        float, Range(0, 1, why="the ratio's floor, a share of admit.new_token_ratio")
    ] = 0.14
    ratio_decay_steps: Annotated[
        int, Range(1, MAX_STALL_ITERATIONS, why="iterations of decay; beyond, it never decays")
    ] = 600
    trace_events: bool = False

    def validate(self) -> None:
        buckets = self.cuda_graph_buckets
        require(
            list(buckets) == sorted(set(buckets)),
            "cuda_graph_buckets",
            f"must be positive batch sizes in increasing order, got {list(buckets)}",
        )


ENGINES = ("sglang", "vllm", "cpkv")
"""``admit.engine``: whose scheduler a serving run models: ``sglang`` (SGLang's own scheduler
loop, iteration for iteration, around its ``PrefillAdder``; a host tier and the CP limits on
top as cpkv's extension), ``vllm`` (vLLM's V1 scheduler, step for step) or ``cpkv`` (cpkv's
own serving loop around SGLang's ``PrefillAdder`` and seed 004's policies, with the policy
options of the admission-policy space). Null (the default): SGLang's loop when it models
everything the config asks for, else cpkv's loop
(:func:`~cpkv.serving.engine_choice.chosen_engine`)."""


VllmTokens = Annotated[int, Range(1, MAX_TOKENS, why=TOKENS_WHY)]


@dataclass(frozen=True)
class VllmSpec:
    """``admit.vllm``: the knobs of vLLM 0.32.0's V1 scheduler and KV cache (``admit.engine:
        vllm``), under vLLM's names and with the defaults of its ``SchedulerConfig`` and
        ``CacheConfig`` (``vllm serve`` raises ``max_num_batched_tokens`` and ``max_num_seqs``
        on large GPUs: give the values your server logs).

        ``num_gpu_blocks`` (vLLM derives it from the GPU memory left after the weights): null
        takes ``admit.kv``'s tokens (``capacity_blocks * block_size``) in blocks of
        ``block_size``, plus vLLM's null block. ``max_model_len`` (vLLM reads it from the model):
        null takes the longest prompt + output of the workload, rounded up to a block (a drawn
    ``synthetic`` workload: the whole pool); a request reaching it stops there; a prompt
        that reaches it is rejected, as vLLM's front end rejects it. vLLM refuses to start when
        one request of ``max_model_len`` tokens cannot fit the pool; so does cpkv.
    """

    max_num_batched_tokens: VllmTokens = 2048
    max_num_seqs: VllmTokens = 128
    long_prefill_token_threshold: Annotated[int, Range(0, MAX_TOKENS, why=TOKENS_WHY)] = 0
    enable_prefix_caching: bool = True
    scheduler_reserve_full_isl: bool = True
    policy: Literal["fcfs", "priority"] = "fcfs"
    block_size: VllmTokens = 16
    num_gpu_blocks: VllmTokens | None = None
    max_model_len: VllmTokens | None = None

    def validate(self) -> None:
        require(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "max_num_batched_tokens",
            f"must be >= max_num_seqs ({self.max_num_seqs}), as vLLM requires; got "
            f"{self.max_num_batched_tokens}",
        )
        require(
            self.num_gpu_blocks is None or self.num_gpu_blocks >= 2,
            "num_gpu_blocks",
            f"must be >= 2 (block 0 is vLLM's null block), got {self.num_gpu_blocks}",
        )


PositiveTokens = Annotated[int, Range(1, MAX_TOKENS, why=TOKENS_WHY)]


@dataclass(frozen=True)
class SglangSpec:
    """``admit.sglang``: the server arguments of SGLang 0.5.23's scheduler loop
    (``admit.engine: sglang``) that the ``admit`` block does not hold already, under
    SGLang's names and with its defaults.

    The loop also reads ``admit``'s ``chunked_prefill_size`` (null: chunked prefill off),
    ``max_prefill_tokens``, ``page_size``, ``max_running_requests``, ``schedule_policy``
    (``fcfs`` or ``lof``), ``new_token_ratio`` (``SGLANG_INIT_NEW_TOKEN_RATIO``) and
    ``serving.ratio_min_factor`` / ``serving.ratio_decay_steps``. Here:
    ``enable_mixed_chunk`` (decodes ride in prefill batches; only with chunked prefill),
    ``disable_overlap_schedule`` (SGLang's default is the overlap loop: a batch's results are
    processed after the next batch was launched), ``disable_radix_cache``,
    ``schedule_conservativeness`` (scales the new-token ratio), ``cp_limits`` (apply
    ``admit.cp``'s CP shared-KV limits to each prefill batch, as cpkv's loop does: cpkv's
    extension, not SGLang's), ``enable_hierarchical_cache`` (a host tier of ``hicache_ratio``
    times the device pool's tokens, or ``hicache_size_tokens``: SGLang's HiCache with its
    write-through policy, on top of the loop as cpkv's extension; host hits of at least
    ``admit.load_back_threshold`` tokens are loaded back; ``admit.workload.cache``'s L2, when
    that block is given, is the host tier instead), ``max_total_num_tokens`` (null:
    ``admit.kv``'s tokens, ``capacity_blocks x block_size``, plus ``admit.workload.cache``'s
    L1 tokens when that block is given; SGLang derives it from the GPU memory left after the
    weights), ``context_len`` (null: the pool's tokens; a prompt
    reaching it is rejected, an output is clipped to it). ``admit.max_running_requests``
    null takes SGLang's rule: ``min(max(min(tokens / context_len x 512, 4096), 2048),
    tokens / 2)``.
    """

    enable_mixed_chunk: bool = False
    disable_overlap_schedule: bool = False
    disable_radix_cache: bool = False
    schedule_conservativeness: Annotated[
        float, Range(0.01, 100.0, why="scales SGLang's new-token ratio (0.7 at 1.0)")
    ] = 1.0
    cp_limits: bool = False
    enable_hierarchical_cache: bool = False
    hicache_ratio: Annotated[
        float, Range(0.01, 1000.0, why="the host tier's tokens per device token")
    ] = 2.0
    hicache_size_tokens: PositiveTokens | None = None
    max_total_num_tokens: PositiveTokens | None = None
    context_len: PositiveTokens | None = None

    def validate(self) -> None:
        require(
            not (self.enable_hierarchical_cache and self.disable_radix_cache),
            "enable_hierarchical_cache",
            "the host tier keeps the radix cache's nodes: it needs disable_radix_cache false",
        )
