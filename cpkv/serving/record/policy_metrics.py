"""What a serving run reports for the admission-policy space.

Every policy reports, side by side: admission rate, queue time, rejects,
timeouts, cancellations and preemptions by reason, recompute and swap bytes, KV utilisation
(mean, peak), TTFT/TPOT/E2E percentiles, SLO attainment and goodput, and the longest wait.
:class:`~cpkv.serving.record.metrics.ServingRow` has most of them; :class:`PolicyRow` adds the rest
as columns (so that sweeps, ``cpkv diff`` and ``cpkv plot`` compare them), and
:func:`policy_summary` the breakdowns (``results.json`` summary ``policy_space``).

A run reports them when a policy key is not a default, or with ``admit.serving.
policy_metrics: true``.

* ``swap_bytes``: KV bytes copied to host and back (``swap_out + swap_in`` tokens x
  ``admit.cost``'s bytes per token); ``recompute_bytes``: the KV that preemptions discarded;
* ``longest_wait_ms``: the longest time a request waited in the queue before its first
  admission, or before it left the queue (timed out, cancelled);
* ``padding_ms``: the decode time spent on CUDA-graph padding requests;
* ``reservation_exceeded``: ``profiled`` requests that generated more than they reserved.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from cpkv.core.schema import to_dict
from cpkv.runs.results import metric
from cpkv.serving.cost.graph_padding import PaddedDecodeCost
from cpkv.serving.record.metrics import ServingRow


@dataclass(frozen=True)
class PolicyRow(ServingRow):
    """A :class:`ServingRow` with the admission-policy columns."""

    timed_out: int = metric(unit="requests")
    cancelled: int = metric(unit="requests")
    preemptions_growth: int = metric(unit="events")
    preemptions_priority: int = metric(unit="events")
    recompute_bytes: int = metric(unit="bytes")
    swap_bytes: int = metric(unit="bytes")
    longest_wait_ms: float | None = metric(unit="ms")
    padding_ms: float = metric(unit="ms")
    reservation_exceeded: int = metric(unit="requests")


def policy_counts(engine: Any) -> dict[str, Any]:
    """What the engine's request lifecycle and its scheduler counted, by name."""
    lifecycle = engine.lifecycle
    counts: dict[str, Any] = {
        "timed_out": 0, "cancelled": {}, "priority_preemptions": 0, "swap_out_tokens": 0,
        "swap_in_tokens": 0, "invariant_checks": 0,
    }  # fmt: skip
    if lifecycle is not None:
        counts.update(vars(lifecycle.counts))
    if engine.invariants is not None:
        counts["invariant_checks"] = engine.invariants.checks
    scheduler = engine.scheduler
    counts["profiled_finished"] = getattr(scheduler, "finished", 0)
    counts["reservation_exceeded"] = getattr(scheduler, "reservation_exceeded", 0)
    return counts


def _padding(settings: Any) -> PaddedDecodeCost | None:
    cost = settings.cost
    while cost is not None and not isinstance(cost, PaddedDecodeCost):
        cost = getattr(cost, "inner", None)
    return cost


def policy_summary(
    block: Any, settings: Any, counts: dict[str, Any], counters: dict[str, Any], stats: Any,
    quantiles: list[int | None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The summary's ``policy_space`` block (module docstring) from the engines'
    :func:`policy_counts` (added up), counters and request summary; ``quantiles``: a
    ``profiled`` run's final quantile per engine (one: a number, several: a list)."""
    per_token = settings.cost.kv_bytes_per_token
    preemptions = dict(sorted(counters["preemptions"].items()))
    padding = _padding(settings)
    out: dict[str, Any] = {
        "schedule_policy": block.schedule_policy,
        "priority_scheduling": block.enable_priority_scheduling,
        "on_preempt": block.serving.on_preempt,
        "terminal": {
            "finished": stats.finished,
            "rejected": stats.rejected,
            "timed_out": stats.timed_out,
            "cancelled": stats.cancelled,
        },
        "cancelled_by_where": dict(sorted(counts["cancelled"].items())),
        "preemptions_by_reason": preemptions,
        "recompute_bytes": stats.recomputed * per_token,
        "swap_out_tokens": counts["swap_out_tokens"],
        "swap_in_tokens": counts["swap_in_tokens"],
        "swap_bytes": (counts["swap_out_tokens"] + counts["swap_in_tokens"]) * per_token,
        "longest_wait_ms": stats.longest_wait_ms,
        "safety_margin_blocks": block.kv.safety_margin_blocks,
        "invariant_checks": counts["invariant_checks"],
    }
    if block.schedule_policy == "deadline":
        out["deadline"] = to_dict(block.deadline)
    if block.policy == "profiled":
        quantile = quantiles[0] if quantiles and len(quantiles) == 1 else quantiles
        out["profiled"] = {
            **to_dict(block.profiled),
            "finished": counts["profiled_finished"],
            "reservation_exceeded": counts["reservation_exceeded"],
            "final_quantile_tokens": quantile,
        }
    if padding is not None:
        out["cuda_graph"] = {
            "buckets": list(block.serving.cuda_graph_buckets),
            "padding_requests": padding.padding_requests,
            "padding_ms": padding.padding_us / 1000.0,
        }
    if block.policy != "prefill_adder":
        it = block.iteration
        out["iteration_weights"] = {**to_dict(it.weights), "verify_tokens": it.verify_tokens}
    return out


def policy_row(row: ServingRow, policy: dict[str, Any]) -> PolicyRow:
    """``row`` with the policy columns."""
    base = {f.name: getattr(row, f.name) for f in fields(ServingRow)}
    preemptions = policy["preemptions_by_reason"]
    terminal = policy["terminal"]
    return PolicyRow(
        **base,
        timed_out=terminal["timed_out"],
        cancelled=terminal["cancelled"],
        preemptions_growth=sum(v for k, v in preemptions.items() if k.startswith("kv_growth")),
        preemptions_priority=preemptions.get("priority", 0),
        recompute_bytes=policy["recompute_bytes"],
        swap_bytes=policy["swap_bytes"],
        longest_wait_ms=policy["longest_wait_ms"],
        padding_ms=policy.get("cuda_graph", {}).get("padding_ms", 0.0),
        reservation_exceeded=policy.get("profiled", {}).get("reservation_exceeded", 0),
    )
