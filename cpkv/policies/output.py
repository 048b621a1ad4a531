"""The block policies as the output of a ``cpkv admit`` run: rows, summary, extra files.

* ``iteration``: one row per tick (:class:`~cpkv.policies.iteration.IterationTick`);
* ``conservative`` / ``optimistic``: one row per request
  (:class:`~cpkv.policies.blocks.AdmitDecision`); the optimistic growth trace goes to
  ``growth.jsonl`` (one :class:`~cpkv.policies.blocks.GrowthEvent` per line).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cpkv.core.kinds import RunContext
from cpkv.core.schema import to_dict
from cpkv.policies.blocks import DEFAULT_SCANS, BlockOutcome, KvBlocks
from cpkv.policies.iteration import IterationBudget, IterationTick
from cpkv.policies.registry import POLICIES, BlockPolicyInputs, run_block_policy
from cpkv.policies.requests import load_block_requests
from cpkv.runs.results import RunOutput

ITERATION_COLUMNS = ("tick", "decode_tokens", "prefill_tokens", "remaining_prompt_tokens")
BLOCK_COLUMNS = (
    "rid", "prompt_tokens", "max_new_tokens", "need_blocks", "admitted", "reason", "reserved_blocks_after",
)  # fmt: skip


def prepare_block_policy(block: Any) -> Callable[[RunContext], RunOutput]:
    """``cpkv admit`` when ``admit.policy`` is a block policy (``block``: the ``admit`` block).

    Reads the workload and runs the policy now, so that user errors surface before a run
    directory exists; the ``iteration`` policy reads no requests.
    """
    reads = POLICIES.get(block.policy).reads
    requests = (
        load_block_requests(block.workload, block.max_new_tokens)
        if reads == "block_requests"
        else ()
    )
    inputs = BlockPolicyInputs(kv=block.kv, iteration=block.iteration, requests=requests)
    # the policies are cheap: run now, so that their ConfigErrors (e.g. capacity) come first
    out = block_policy_output(block.policy, inputs)
    if reads == "block_requests":
        out = replace(out, summary={**out.summary, "workload": block.workload.source})

    def execute(ctx: RunContext) -> RunOutput:
        ctx.report(1, 1, f"block policy {block.policy}")
        return out

    return execute


def block_policy_output(name: str, inputs: BlockPolicyInputs) -> RunOutput:
    """Run block policy ``name`` and shape its result for a run directory."""
    result = run_block_policy(name, inputs)
    if isinstance(result, BlockOutcome):
        return _block_output(result, inputs.kv)
    return _iteration_output(result, inputs.iteration)


def _iteration_output(ticks: tuple[IterationTick, ...], budget: IterationBudget) -> RunOutput:
    decode = sum(t.decode_tokens for t in ticks)
    prefill = sum(t.prefill_tokens for t in ticks)
    capacity = len(ticks) * budget.budget_tokens
    summary = {
        "policy": "iteration",
        **{k: v for k, v in to_dict(budget).items() if k not in ("weights", "verify_tokens")},
        "ticks": len(ticks),
        "decode_tokens": decode,
        "prefill_tokens": prefill,
        "budget_utilization": (decode + prefill) / capacity if capacity else 0.0,
    }
    note = "iteration budget: decodes first, then one prompt chunk per tick (equal-cost tokens)"
    return RunOutput(
        rows=list(ticks), summary=summary, table_columns=ITERATION_COLUMNS, notes=[note]
    )


def _block_output(out: BlockOutcome, kv: KvBlocks) -> RunOutput:
    preempted = [e.rid for e in out.events if e.event == "preempted"]
    summary = {
        "policy": out.policy,
        "block_size": kv.block_size,
        "capacity_blocks": kv.capacity_blocks,
        "scan": kv.scan or DEFAULT_SCANS[out.policy],
        "requests": len(out.decisions),
        "admitted": len(out.admitted),
        "admitted_rids": list(out.admitted),
        "waiting": len(out.decisions) - len(out.admitted),
        "reserved_blocks": out.reserved_blocks,
    }
    summary["headline"] = {"admitted": len(out.admitted), "reserved_blocks": out.reserved_blocks}
    extras: dict[str, str] = {}
    notes = []
    if out.policy == "optimistic":
        summary.update(
            victim=kv.victim,
            on_finish=kv.on_finish,
            growth_events=len(out.events),
            generated_tokens=sum(e.event == "advanced" for e in out.events),
            preemptions=len(preempted),
            preempted_rids=preempted,
            peak_used_blocks=out.peak_used_blocks,
            final_used_blocks=out.final_used_blocks,
        )
        summary["headline"]["preemptions"] = len(preempted)
        extras["growth.jsonl"] = "".join(json.dumps(to_dict(e)) + "\n" for e in out.events)
        notes.append(
            f"optimistic growth: {len(out.events)} events, {len(preempted)} preempted "
            f"({', '.join(preempted) or 'none'}); the trace is in growth.jsonl"
        )
    return RunOutput(
        rows=list(out.decisions),
        summary=summary,
        extras=extras,
        table_columns=BLOCK_COLUMNS,
        notes=notes,
        summary_directions={"admitted": "higher", "waiting": "lower", "preemptions": "lower"},
    )
