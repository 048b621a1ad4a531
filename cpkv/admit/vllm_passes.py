"""``cpkv admit`` with ``admit.mode: passes`` and ``admit.engine: vllm``: a queue through vLLM's
V1 scheduler (:mod:`cpkv.vllm`), step by step.

Every request of ``admit.workload`` is in the waiting queue at step 0, in the workload's
order (its arrival order under ``admit.vllm.policy: priority`` ties), asking for its
``max_new_tokens`` (``admit.max_new_tokens`` when the source gives none); a trace's requests
share prefix blocks by their ``hash_ids``, any other request shares nothing. Each step is one
``schedule()`` and one ``update()`` with a one-token output per request whose scheduled
tokens reach its length, until every request has finished (no time: the cost models price
``admit.mode: serving``).

``results.json`` / ``results.txt`` hold one :class:`VllmStepRow` per step (who was scheduled
with how many tokens, the preemptions, the free blocks, what stopped admission);
``ticks.jsonl`` one line per step with every field of the vLLM oracle's record
(:func:`cpkv.vllm.scenario.plan_record`: every scheduled request with its tokens and computed
tokens, failed allocations, the queues' lengths, the finished requests).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cpkv.core.errors import CpkvError
from cpkv.core.kinds import RunContext
from cpkv.runs.results import RunOutput, metric, outcome
from cpkv.serving.engine.vllm_engine import (
    BlockNames,
    check_no_fixed_hits,
    vllm_settings_from,
)
from cpkv.serving.input.workload import load_serving_workload
from cpkv.serving.schema import ArrivalsSpec
from cpkv.vllm import VLLM_VERSION, Scheduler
from cpkv.vllm.request import Request
from cpkv.vllm.scenario import plan_record

if TYPE_CHECKING:
    from cpkv.admit.schema import AdmitConfig

DECODE_SHOWN = 4
"""Decoding requests named in a row's ``running`` before the rest are counted."""


class QueueStalled(CpkvError):
    """A step scheduled nothing and preempted nothing while requests were left."""


@dataclass(frozen=True)
class VllmStepRow:
    """One step. ``new``, ``resumed``, ``running``: ``id:tokens`` of each scheduled request
    (the running ones that decode one token are counted after the first few)."""

    tick: int
    new: str = outcome()
    resumed: str = outcome()
    running: str = outcome()
    preempted: str = outcome()
    stop: str = outcome()
    finished: str = outcome()
    scheduled_tokens: int = metric(unit="tokens", lower_is_better=False)
    token_budget_left: int = metric(unit="tokens")
    free_blocks: int = metric(unit="blocks", lower_is_better=False)
    running_requests: int = metric(unit="requests", lower_is_better=False)
    waiting_requests: int = metric(unit="requests")


TABLE_COLUMNS = (
    "tick", "new", "resumed", "running", "preempted", "scheduled_tokens", "free_blocks",
    "waiting_requests", "stop", "finished",
)  # fmt: skip

SUMMARY_DIRECTIONS = {
    "ticks": "lower",  # steps to drain the same queue
    "preemptions": "lower",
    "prefix_hit_tokens": "higher",
    "first_batch_requests": "neutral",
}
"""How ``cpkv diff`` judges the summary numbers of a vLLM passes run (others: ``changed``)."""


def _listed(entries: list[dict]) -> str:
    return ", ".join(f"{e['id']}:{e['n']}" for e in entries) or "-"


def _running(entries: list[dict]) -> str:
    """The running requests scheduled: prefill chunks by name, then the first decoding ones,
    then how many more decode."""
    shown = [e for e in entries if e["n"] != 1]
    decoding = [e for e in entries if e["n"] == 1]
    names = [f"{e['id']}:{e['n']}" for e in shown + decoding[:DECODE_SHOWN]]
    more = len(decoding) - DECODE_SHOWN
    if more > 0:
        names.append(f"+{more} more:1")
    return ", ".join(names) or "-"


def step_row(tick: int, rec: dict, running: int, waiting: int, finished: list[str]) -> VllmStepRow:
    """The table row of one step (``rec``: its :func:`~cpkv.vllm.scenario.plan_record`)."""
    return VllmStepRow(
        tick=tick,
        new=_listed(rec["new"]),
        resumed=_listed(rec["resumed"]),
        running=_running(rec["running"]),
        preempted=", ".join(rec["preempted"]) or "-",
        stop=rec["waiting_stop"],
        finished=", ".join(finished) or "-",
        scheduled_tokens=rec["total_tokens"],
        token_budget_left=rec["token_budget_left"],
        free_blocks=rec["free_blocks_after_schedule"],
        running_requests=running,
        waiting_requests=waiting,
    )


def queue_requests(block: Any, seed: int) -> tuple[Any, list[Request], list[str]]:
    """The scheduler's config, the queue's requests, and the ids of those whose prompt
    reaches ``max_model_len`` (rejected, as vLLM's front end rejects them; user errors
    surface here)."""
    workload = load_serving_workload(block.workload, block.max_new_tokens, seed)
    check_no_fixed_hits(workload, f"admit.workload ({block.workload.source})")
    reqs = list(workload.arriving(ArrivalsSpec(process="zero"), seed))
    settings = vllm_settings_from(block, None, workload, reqs)
    size, longest = settings.block_size, settings.config.max_model_len
    requests = [
        Request.sized(
            r.rid, r.index, r.prompt_tokens, r.max_new_tokens,
            BlockNames(r, size, settings.trace_block_tokens), r.priority, float(r.index),
        )
        for r in reqs
        if r.prompt_tokens < longest
    ]  # fmt: skip
    rejected = [r.rid for r in reqs if r.prompt_tokens >= longest]
    return settings.config, requests, rejected


def prepare_vllm_passes(cfg: AdmitConfig) -> Callable[[RunContext], RunOutput]:
    """Read the workload and build the queue (user errors surface here), then run it."""
    block = cfg.admit
    config, requests, rejected = queue_requests(block, cfg.seed)

    def execute(ctx: RunContext) -> RunOutput:
        ctx.report(0, 1, f"{len(requests)} requests through vLLM {VLLM_VERSION}'s scheduler")
        ticks = ctx.stream("ticks.jsonl")
        rows, totals = run_queue(config, requests, ticks.write)
        ctx.report(1, 1, "done")
        extras = {}
        kept = ticks.text()
        if kept is not None:  # no run directory: the lines were kept in memory
            extras["ticks.jsonl"] = kept
        summary = {
            "engine": "vllm",
            "vllm_version": VLLM_VERSION,
            "policy": config.policy,
            "workload": block.workload.source,
            **totals,
            "rejected_exceeds_max_model_len": len(rejected),
            "vllm": _knobs(config),
            "headline": {
                "ticks": totals["ticks"], "requests_finished": totals["requests_finished"],
                "first_batch_requests": totals["first_batch_requests"],
            },
        }  # fmt: skip
        return RunOutput(
            rows=rows,
            summary=summary,
            extras=extras,
            table_columns=TABLE_COLUMNS,
            notes=_notes(config, rejected),
            summary_directions=SUMMARY_DIRECTIONS,
        )

    return execute


def run_queue(
    config: Any, requests: list[Request], write: Callable[[str], Any]
) -> tuple[list[VllmStepRow], dict[str, Any]]:
    """Every request queued at step 0, then steps until all have finished: the rows, the
    totals; each step's record goes to ``write`` as a JSON line."""
    sched = Scheduler(config)
    for request in requests:
        sched.add_request(request)
    rows: list[VllmStepRow] = []
    stops: dict[str, int] = {}
    preemptions = hit_tokens = prefill = decode = finished_count = first = 0
    tick = 0
    while sched.has_requests():
        plan = sched.schedule()
        if not plan.total_tokens and not plan.preempted:
            if sched.running or len(sched.waiting):
                raise QueueStalled(
                    f"admit.engine=vllm: step {tick} scheduled nothing with "
                    f"{len(sched.running)} running and {len(sched.waiting)} waiting "
                    f"({sched.free_blocks} of {config.num_gpu_blocks - 1} blocks free)"
                )
            sched.update(plan)  # (vLLM's empty step after the last finish: not a tick)
            break
        rec = plan_record(sched, plan)
        for entry in rec["new"]:
            hit_tokens += entry["computed"]
        for entries in (rec["new"], rec["resumed"], rec["running"]):
            for entry in entries:
                if entry["n"] == 1 and entry["computed"] >= _prompt(sched, entry["id"]):
                    decode += 1
                else:
                    prefill += entry["n"]
        if not tick:
            first = len(rec["new"])
        preemptions += len(plan.preempted)
        stops[rec["waiting_stop"]] = stops.get(rec["waiting_stop"], 0) + 1
        running, waiting = len(sched.running), len(sched.waiting)
        finished = sched.update(plan)
        finished_count += len(finished)
        rec.update(tick=tick, running_requests=running, waiting_requests=waiting,
                   finished=finished, free_blocks_after_update=sched.free_blocks)  # fmt: skip
        write(json.dumps(rec, separators=(",", ":")) + "\n")
        rows.append(step_row(tick, rec, running, waiting, finished))
        tick += 1
    totals = {
        "ticks": tick, "requests": len(requests), "requests_finished": finished_count,
        "preemptions": preemptions, "prefix_hit_tokens": hit_tokens,
        "prefill_tokens": prefill, "decode_tokens": decode,
        "admission_stops": dict(sorted(stops.items())), "first_batch_requests": first,
    }  # fmt: skip
    return rows, totals


def _prompt(sched: Scheduler, request_id: str) -> int:
    request = sched.requests.get(request_id)
    return request.num_prompt_tokens if request is not None else 0


def _knobs(config: Any) -> dict[str, Any]:
    names = (
        "max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold",
        "enable_prefix_caching", "scheduler_reserve_full_isl", "policy", "block_size",
        "num_gpu_blocks", "max_model_len",
    )  # fmt: skip
    return {name: getattr(config, name) for name in names}


def _notes(config: Any, rejected: list[str]) -> list[str]:
    notes = [
        f"every tick is one step of vLLM {VLLM_VERSION}'s V1 scheduler over the queue "
        f"(schedule() then update() with one token for each request whose prompt is "
        f"computed), every request queued at tick 0, until all have finished; policy "
        f"{config.policy}, max_num_batched_tokens {config.max_num_batched_tokens}, "
        f"max_num_seqs {config.max_num_seqs}, {config.num_gpu_blocks} blocks x "
        f"{config.block_size} tokens (block 0 is vLLM's null block)",
        "stop: what ended the waiting queue's admission in that step (preempted_this_step, "
        "queue_empty, kv_blocks, token_budget, max_num_seqs)",
        "ticks.jsonl holds every field of every tick (each scheduled request with its tokens "
        "and computed tokens, failed allocations, the queues' lengths)",
    ]
    if rejected:
        shown = ", ".join(rejected[:5]) + (", ..." if len(rejected) > 5 else "")
        notes.append(
            f"{len(rejected)} requests rejected, their prompt reaching max_model_len "
            f"{config.max_model_len} (as vLLM's front end rejects them): {shown}"
        )
    return notes
