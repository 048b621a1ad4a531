"""SGLang 0.5.23's waiting-queue policies and priority preemption (``schedule_policy.py``).

Holds: ``config`` (the ``admit.schedule_policy`` keys: :class:`SchedulePolicyConfig`),
``order`` (``SchedulePolicy.calc_priority``: :class:`WaitingQueueOrder`), ``trees`` (the
in-batch waiting-queue tree and the ``dfs-weight`` walk over trace block hashes) and
``preempt`` (``PrefillAdder.preempt_to_schedule``: :func:`choose_preemption`). Each is
checked against the real SGLang objects in ``tests/admission/test_schedule_policy_oracle.py``.

A scheduler uses it as SGLang's does: once per prefill pass, before the scan,
``order.sort(waiting, match, processed_tokens, sibling_rank)``; during the scan, when the
batch is full and :attr:`SchedulePolicyConfig.priority_preemption` is on,
``choose_preemption(...)`` for the candidate.

May import: ``cpkv.core``, ``cpkv.workload`` (as the rest of ``cpkv.admission``).
"""

from cpkv.admission.schedule_policy.config import (
    CACHE_AGNOSTIC,
    CACHE_AWARE,
    PRIORITY_POLICIES,
    SCHEDULE_POLICIES,
    SchedulePolicyConfig,
    degenerate_note,
)
from cpkv.admission.schedule_policy.order import (
    WAITING_QUEUE_PREFIX_MATCH_MAX,
    QueuedRequest,
    WaitingQueueOrder,
    WaitingRequest,
    resolve_priority,
)
from cpkv.admission.schedule_policy.preempt import (
    Preemption,
    RunningRequest,
    RunningState,
    choose_preemption,
    preemption_need_tokens,
    running_token_offset,
)
from cpkv.admission.schedule_policy.trees import WaitingPrefixTree, dfs_weight_order

__all__ = [
    "CACHE_AGNOSTIC",
    "CACHE_AWARE",
    "PRIORITY_POLICIES",
    "SCHEDULE_POLICIES",
    "WAITING_QUEUE_PREFIX_MATCH_MAX",
    "Preemption",
    "QueuedRequest",
    "RunningRequest",
    "RunningState",
    "SchedulePolicyConfig",
    "WaitingPrefixTree",
    "WaitingQueueOrder",
    "WaitingRequest",
    "choose_preemption",
    "dfs_weight_order",
    "degenerate_note",
    "preemption_need_tokens",
    "resolve_priority",
    "running_token_offset",
]
