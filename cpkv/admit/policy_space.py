"""Which admission-policy settings make sense together.

:func:`check_policy_space` runs after the ``admit`` block's own checks and raises a
:class:`~cpkv.core.schema.FieldError` (one line, exit 2) for a combination that nothing
would read or that contradicts itself:

* cpkv's serving-only keys (``policy: profiled``, ``schedule_policy: deadline``,
  ``serving.on_preempt: swap``, ``serving.queue_timeout_ms``, ``serving.check_invariants``,
  ``serving.cuda_graph_buckets``, ``serving.policy_metrics``, ``kv.safety_margin_blocks``,
  ``iteration.weights`` and ``iteration.verify_tokens``) outside ``mode: serving``;
* SGLang's waiting-queue orders other than ``fcfs`` and priority scheduling with a policy
  other than ``prefill_adder`` (they order SGLang's PrefillAdder queue);
* token weights or verification tokens with ``prefill_adder`` (its budgets are SGLang's
  ``max_prefill_tokens`` and ``chunked_prefill_size``);
* an ``admit.profiled`` block without ``policy: profiled``, an ``admit.deadline`` block
  without ``schedule_policy: deadline``;
* a safety margin that leaves no block.
"""

from __future__ import annotations

from typing import Any

from cpkv.core.schema import FieldError
from cpkv.policies.budgets import TokenWeights
from cpkv.policies.deadline import DeadlineSpec
from cpkv.policies.profiled import ProfiledSpec


def serving_only_settings(block: Any) -> list[str]:
    """The cpkv serving-only keys set to other than their defaults."""
    s, it = block.serving, block.iteration
    found = []
    if block.policy == "profiled":
        found.append("policy")
    if block.schedule_policy == "deadline":
        found.append("schedule_policy")
    if s.on_preempt == "swap":
        found.append("serving.on_preempt")
    for key in ("queue_timeout_ms", "cuda_graph_buckets"):
        if getattr(s, key):
            found.append(f"serving.{key}")
    for key in ("check_invariants", "policy_metrics"):
        if getattr(s, key):
            found.append(f"serving.{key}")
    if block.kv.safety_margin_blocks:
        found.append("kv.safety_margin_blocks")
    if it.weights != TokenWeights():
        found.append("iteration.weights")
    if it.verify_tokens:
        found.append("iteration.verify_tokens")
    if block.deadline != DeadlineSpec():
        found.append("deadline")
    if block.profiled != ProfiledSpec():
        found.append("profiled")
    return found


def check_policy_space(block: Any) -> None:
    """Raise FieldError for a combination that makes no sense (module docstring)."""
    if block.mode != "serving":
        found = serving_only_settings(block)
        if found:
            raise FieldError(
                found[0],
                f"is read only by the serving simulation; set admit.mode serving (mode here: {block.mode})",
            )
        return
    sglang_order = block.schedule_policy not in ("fcfs", "deadline")
    if block.policy != "prefill_adder":
        if sglang_order:
            raise FieldError(
                "schedule_policy",
                f"{block.schedule_policy!r} orders SGLang's PrefillAdder queue: it needs policy "
                f"prefill_adder (policy here: {block.policy}); cpkv's deadline order runs with every policy",
            )
        if block.enable_priority_scheduling:
            raise FieldError(
                "enable_priority_scheduling",
                f"SGLang's priority scheduling needs policy prefill_adder (policy here: {block.policy})",
            )
    it = block.iteration
    if block.policy == "prefill_adder" and (it.weights != TokenWeights() or it.verify_tokens):
        key = "iteration.weights" if it.weights != TokenWeights() else "iteration.verify_tokens"
        raise FieldError(
            key,
            "weights the iteration token budget of conservative, optimistic, iteration and "
            "profiled; prefill_adder budgets by SGLang's max_prefill_tokens and chunked_prefill_size",
        )
    if block.policy != "profiled" and block.profiled != ProfiledSpec():
        raise FieldError(
            "profiled", f"is read only by policy profiled (policy here: {block.policy})"
        )
    if block.schedule_policy != "deadline" and block.deadline != DeadlineSpec():
        raise FieldError(
            "deadline",
            f"is read only by schedule_policy deadline (schedule_policy here: {block.schedule_policy})",
        )
    margin, cap = block.kv.safety_margin_blocks, block.kv.capacity_blocks
    if margin >= cap:
        raise FieldError(
            "kv.safety_margin_blocks",
            f"{margin} leaves none of the {cap} blocks of admit.kv.capacity_blocks to requests",
        )
