"""The non-default admission-policy keys of a serving run (issue 13), as the loop reads them:
:class:`PolicyOptions` (``SimSettings.extra``) and :func:`options_from`, which gives None when
every key is a default, so that such a run has no policy machinery at all
(:mod:`cpkv.serving.lifecycle`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpkv.admission.schedule_policy.config import SchedulePolicyConfig
from cpkv.policies.budgets import TokenWeights
from cpkv.policies.profiled import ProfiledSpec


@dataclass(frozen=True)
class PolicyOptions:
    """The non-default policy keys of a run (built by :func:`options_from`)."""

    schedule: SchedulePolicyConfig = SchedulePolicyConfig()
    deadline_aging_ms: float | None = None  # set: schedule_policy deadline
    slo_ttft_ms: float | None = None
    profiled: ProfiledSpec | None = None  # set: policy profiled
    weights: TokenWeights = TokenWeights()
    verify_tokens: int = 0
    max_running_requests: int | None = None  # block policies (prefill_adder: AdderBudgets)
    safety_margin_blocks: int = 0
    swap: bool = False
    queue_timeout_ms: float | None = None
    check_invariants: bool = False
    cuda_graph_buckets: tuple[int, ...] = ()
    seed: int = 0
    cancellations: bool = False  # the workload carries cancel_ms (a run must honour them)


def options_from(block: Any, seed: int, cancellations: bool = False) -> PolicyOptions | None:
    """The run's :class:`PolicyOptions`, or None when every policy key is a default and no
    request carries a cancel time (the loop then runs without a :class:`Lifecycle`)."""
    s, it = block.serving, block.iteration
    schedule = SchedulePolicyConfig(
        **{k: getattr(block, k) for k in SchedulePolicyConfig.__dataclass_fields__}
    )
    deadline = block.schedule_policy == "deadline"
    if deadline:
        schedule = SchedulePolicyConfig()
    opts = PolicyOptions(
        schedule=schedule,
        deadline_aging_ms=block.deadline.aging_ms if deadline else None,
        slo_ttft_ms=block.slo.ttft_ms if deadline else None,
        profiled=block.profiled if block.policy == "profiled" else None,
        weights=it.weights,
        verify_tokens=it.verify_tokens,
        max_running_requests=block.max_running_requests
        if block.policy != "prefill_adder"
        else None,
        safety_margin_blocks=block.kv.safety_margin_blocks,
        swap=s.on_preempt == "swap",
        queue_timeout_ms=s.queue_timeout_ms,
        check_invariants=s.check_invariants,
        cuda_graph_buckets=tuple(s.cuda_graph_buckets),
        seed=seed,
        cancellations=cancellations,
    )
    return None if opts == PolicyOptions(seed=seed) else opts
