"""The ``admit`` keys of SGLang 0.5.23's waiting-queue policy and priority scheduling.

Names and defaults are SGLang's server arguments (``--schedule-policy``,
``--enable-priority-scheduling``, ``--schedule-low-priority-values-first``,
``--priority-scheduling-preemption-threshold``, ``--disable-priority-preemption``) and its two
in-batch prefix-caching environment variables (``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD``,
``IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD``). :class:`SchedulePolicyConfig` is mixed
into the flat ``admit:`` block (``admit.schedule_policy``, ...).

Refused, as SGLang refuses them: an unknown policy; priority scheduling with a policy other
than ``fcfs`` or ``lof`` (``ServerArgs`` asserts it). ``priority`` is one of SGLang's
``--schedule-policy`` choices, yet ``SchedulePolicy`` rejects it ("Unknown schedule_policy"),
so it is refused with a pointer to what works. ``routing-key`` orders by the running batch's
routing keys, which no cpkv workload carries: refused too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from cpkv.core.schema import FieldError, Range
from cpkv.core.schema.limits import INT64_MAX, INT64_WHY, MAX_TOKENS, TOKENS_WHY
from cpkv.core.suggest import did_you_mean

PreemptionThreshold = Annotated[
    int,
    Range(
        0, INT64_MAX, why=INT64_WHY,
        low_why="a priority difference; below 0, requests of equal priority preempt each other",
    ),
]  # fmt: skip
PrefixThreshold = Annotated[int, Range(-1, MAX_TOKENS, why=TOKENS_WHY, low_why="-1 turns it off")]

CACHE_AGNOSTIC = ("fcfs", "lof", "random")
"""Policies that order without the prefix tree (SGLang's ``CacheAgnosticPolicy``)."""
CACHE_AWARE = ("lpm", "dfs-weight", "hrrn", "shortest-prefill-first")
"""Policies that match every waiting request in the prefix tree (``CacheAwarePolicy``)."""
SCHEDULE_POLICIES = CACHE_AGNOSTIC + CACHE_AWARE
PRIORITY_POLICIES = ("fcfs", "lof")
"""The only policies SGLang allows with ``--enable-priority-scheduling``."""

_NOT_MODELLED = {
    "priority": (
        "SGLang 0.5.23 lists 'priority' among --schedule-policy choices but its SchedulePolicy "
        "rejects it (Unknown schedule_policy); for priority order use schedule_policy=fcfs (or "
        "lof) with enable_priority_scheduling=true"
    ),
    "routing-key": (
        "'routing-key' orders by the running batch's routing keys, which cpkv's workloads do "
        "not carry"
    ),
}


@dataclass(frozen=True)
class SchedulePolicyConfig:
    """SGLang's waiting-queue order and priority scheduling (defaults: SGLang's).

    * ``schedule_policy``: ``fcfs``, ``lof``, ``random`` (cache-agnostic) or ``lpm``,
      ``dfs-weight``, ``hrrn``, ``shortest-prefill-first`` (cache-aware).
    * ``enable_priority_scheduling``: order by the request's ``priority`` first (``fcfs``,
      ``lof`` only) and let a waiting request preempt running ones.
    * ``schedule_low_priority_values_first``: smaller ``priority`` values go first (default:
      larger values go first).
    * ``priority_scheduling_preemption_threshold``: a waiting request preempts a running one
      only when their priorities differ by more than this.
    * ``disable_priority_preemption``: priority order without preemption.
    * ``in_batch_prefix_check_threshold`` / ``in_batch_prefix_deprioritize_threshold``:
      with a cache-aware policy, a request whose device prefix is at most the first is
      matched against the requests checked before it in the queue, and goes last when it
      shares at least the second number of tokens with one of them (``-1`` turns the check
      off).
    """

    schedule_policy: str = "fcfs"
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    priority_scheduling_preemption_threshold: PreemptionThreshold = 10
    disable_priority_preemption: bool = False
    in_batch_prefix_check_threshold: PrefixThreshold = 32
    in_batch_prefix_deprioritize_threshold: PrefixThreshold = 32

    def validate_schedule(self, own: str = "") -> None:
        """Raise :class:`FieldError` for an unknown policy or a combination SGLang refuses;
        ``own`` names an order of the caller's own, allowed beside SGLang's (it is
        suggested and listed too, as ``own``)."""
        policy = self.schedule_policy
        if policy in _NOT_MODELLED:
            raise FieldError("schedule_policy", _NOT_MODELLED[policy])
        if policy not in SCHEDULE_POLICIES:
            names = (*SCHEDULE_POLICIES, own) if own else SCHEDULE_POLICIES
            allowed = ", ".join(SCHEDULE_POLICIES) + (f"; cpkv's own: {own}" if own else "")
            raise FieldError(
                "schedule_policy",
                f"unknown policy {policy!r}{did_you_mean(policy, names)} (allowed: {allowed})",
            )
        if self.enable_priority_scheduling and policy not in PRIORITY_POLICIES:
            raise FieldError(
                "enable_priority_scheduling",
                f"SGLang 0.5.23 runs priority scheduling only with schedule_policy fcfs or lof, "
                f"not {policy!r}",
            )

    @property
    def priority_preemption(self) -> bool:
        """SGLang's ``enable_priority_preemption``: priority scheduling without the opt-out."""
        return self.enable_priority_scheduling and not self.disable_priority_preemption


def degenerate_note(
    policy: str, has_prefix_identity: bool, prefix_cache: bool = True
) -> str | None:
    """What a cache-aware ``policy`` becomes without prefix information, or None.

    ``prefix_cache=False`` is SGLang's disabled radix cache: every cache-aware policy but
    ``shortest-prefill-first`` (an error there) runs as ``fcfs``. ``has_prefix_identity=False``
    is a workload without block hashes (grid, jsonl, synthetic): the hits are the requests'
    fixed ``l1/l2_cached_tokens``, no two requests share a prefix in the waiting-queue tree
    (the in-batch deferral never fires) and each cached prefix is its own node of the tree.
    """
    if policy not in CACHE_AWARE:
        return None
    if not prefix_cache:
        if policy == "shortest-prefill-first":
            return "shortest-prefill-first needs prefix caching (SGLang refuses it without)"
        return f"{policy} runs as fcfs: the prefix cache is off (SGLang's disabled radix cache)"
    if has_prefix_identity:
        return None
    return {
        "lpm": "lpm orders by the fixed cached tokens; no in-batch deferral (no shared prefixes)",
        "hrrn": "hrrn uses the fixed cached tokens; no in-batch deferral (no shared prefixes)",
        "shortest-prefill-first": (
            "shortest-prefill-first uses the fixed cached tokens; no in-batch deferral"
        ),
        "dfs-weight": (
            "dfs-weight: every cached prefix is its own node (weight 1): requests with a device "
            "hit first, by when their prefix entered the cache, then the uncached in queue order"
        ),
    }[policy]
