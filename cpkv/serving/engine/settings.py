"""What a serving engine reads: :class:`EngineSettings`, built from the ``admit`` block by
:func:`settings_from` (the policy options by :func:`options_from`: None when every policy
key is a default, so that such a run has none of their machinery)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cpkv.admission.schedule_policy.config import SchedulePolicyConfig
from cpkv.admission.token_ratio import NewTokenRatio
from cpkv.serving.cost.cp.layout import lane_pool
from cpkv.serving.cost.graph_padding import PaddedDecodeCost
from cpkv.serving.cost.model import CostModel
from cpkv.serving.schedulers.adder_pass import AdderBudgets
from cpkv.serving.schedulers.options import PolicyOptions


@dataclass(frozen=True)
class EngineSettings:
    """Everything an engine reads: the policy (``admit.policy``, the scheduler's name), the
    KV pool (``admit.kv``), the token budget of the block policies (``admit.iteration``), the
    PrefillAdder's knobs, SGLang's ratio, the cost model, the stall limit and the policy
    options (None: all defaults)."""

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
    cost: Any = CostModel()
    stall_iterations: int = 1000
    options: PolicyOptions | None = None


def options_from(block: Any, seed: int, cancellations: bool = False) -> PolicyOptions | None:
    """The run's :class:`PolicyOptions`, or None when every policy key is a default and no
    request carries a cancel time."""
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
        max_running_requests=(
            block.max_running_requests if block.policy != "prefill_adder" else None
        ),
        safety_margin_blocks=block.kv.safety_margin_blocks,
        swap=s.on_preempt == "swap",
        queue_timeout_ms=s.queue_timeout_ms,
        check_invariants=s.check_invariants,
        cuda_graph_buckets=tuple(s.cuda_graph_buckets),
        seed=seed,
        cancellations=cancellations,
    )
    return None if opts == PolicyOptions(seed=seed) else opts


def with_lane_pool(block: Any) -> Any:
    """``block`` with ``admit.kv`` sized by the CP owner lanes when
    ``admit.cost.cp.l1_pages_per_rank`` is given (:func:`~cpkv.serving.cost.cp.layout.lane_pool`),
    else ``block`` itself."""
    cp = block.cost.cp
    if cp.l1_pages_per_rank is None:
        return block
    block_tokens, blocks = lane_pool(cp.l1_pages_per_rank, cp.page_size, cp.size)
    return replace(block, kv=replace(block.kv, block_size=block_tokens, capacity_blocks=blocks))


def settings_from(
    block: Any, cost: Any, seed: int = 0, cancellations: bool = False
) -> EngineSettings:
    """The engine's settings from the ``admit`` block (``cost``: possibly fitted; ``seed``:
    the experiment's, for ``schedule_policy: random``; ``cancellations``: requests carry
    ``cancel_ms``)."""
    kv, cp = block.kv, block.cp
    options = options_from(block, seed, cancellations)
    if options is not None and options.cuda_graph_buckets:
        cost = PaddedDecodeCost(cost, options.cuda_graph_buckets)
    limits = (
        (cp.max_batch_requests, cp.max_total_extend_tokens, cp.max_total_cached_tokens)
        if cp.active
        else (None, None, None)
    )
    adder = AdderBudgets(
        kv.block_size, block.max_prefill_tokens, block.chunk_tokens,
        block.max_running_requests, block.prefill_max_requests, block.load_back_threshold,
        *limits,
    )  # fmt: skip
    ratio = NewTokenRatio.from_settings(
        init_ratio=block.new_token_ratio,
        min_factor=block.serving.ratio_min_factor,
        decay_steps=block.serving.ratio_decay_steps,
    )
    return EngineSettings(
        policy=block.policy,
        block_size=kv.block_size,
        capacity_blocks=kv.capacity_blocks,
        scan=kv.scan or "first_fit",
        victim=kv.victim,
        on_preempt=block.serving.on_preempt,
        budget_tokens=block.iteration.budget_tokens,
        chunk_tokens=block.iteration.chunk_tokens,
        adder=adder,
        ratio=ratio,
        cost=cost,
        stall_iterations=block.serving.stall_iterations,
        options=options,
    )
