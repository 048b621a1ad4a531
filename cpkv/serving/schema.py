"""Config blocks of ``admit.mode: serving``: arrivals, SLOs and the serving engine's options.

The iteration-time model is :class:`cpkv.serving.cost.model.CostModel` (``admit.cost``); the KV
pool is ``admit.kv`` (``block_size`` tokens per block, ``capacity_blocks`` blocks, ``scan``,
``victim``) for every policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cpkv.core.schema import non_negative, positive, require


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
    rate_rps: float = 1.0
    speedup: float = 1.0

    def validate(self) -> None:
        positive("rate_rps", self.rate_rps)
        positive("speedup", self.speedup)


@dataclass(frozen=True)
class SloSpec:
    """``admit.slo``: a request meets the SLO when its TTFT and its TPOT are within these
    (``null``: no limit). Requests with one output token have no TPOT and meet that part."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def validate(self) -> None:
        positive("ttft_ms", self.ttft_ms, allow_none=True)
        positive("tpot_ms", self.tpot_ms, allow_none=True)

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
      format (:mod:`cpkv.serving.record.trace_events`; Perfetto, chrome://tracing).
    """

    on_preempt: Literal["requeue", "swap", "abort"] = "requeue"
    stall_iterations: int = 1000
    queue_timeout_ms: float | None = None
    check_invariants: bool = False
    cuda_graph_buckets: tuple[int, ...] = ()
    policy_metrics: bool = False
    timeline_points: int = 200
    ratio_min_factor: float = 0.14
    ratio_decay_steps: int = 600
    trace_events: bool = False

    def validate(self) -> None:
        positive("stall_iterations", self.stall_iterations)
        positive("timeline_points", self.timeline_points)
        positive("queue_timeout_ms", self.queue_timeout_ms, allow_none=True)
        buckets = self.cuda_graph_buckets
        require(
            all(b > 0 for b in buckets) and list(buckets) == sorted(set(buckets)),
            "cuda_graph_buckets",
            f"must be positive batch sizes in increasing order, got {list(buckets)}",
        )
        non_negative("ratio_min_factor", self.ratio_min_factor)
        require(
            self.ratio_decay_steps >= 1,
            "ratio_decay_steps",
            f"must be >= 1, got {self.ratio_decay_steps}",
        )
