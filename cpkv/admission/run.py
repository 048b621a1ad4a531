"""``cpkv admit`` in mode ``passes``: the configured workload through an admission backend, tick by tick.

``results.json`` / ``results.txt`` hold one :class:`TickRow` per tick (a readable table);
``ticks.jsonl`` holds every field of every :class:`~cpkv.admission.records.TickRecord`, load-back
events included, one tick per line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cpkv.admission.records import AdmitResult, TickRecord
from cpkv.admission.ticks import run_admission
from cpkv.admission.timing import timing_note, timing_summary
from cpkv.core.kinds import RunContext
from cpkv.core.schema import to_dict
from cpkv.core.timing import Stopwatch
from cpkv.runs.results import RunOutput, metric, outcome
from cpkv.workload.sources import load_workload

if TYPE_CHECKING:  # the admit kind's config, for annotations only (cpkv.admit sits above)
    from cpkv.admit.schema import AdmitConfig


@dataclass(frozen=True)
class TickRow:
    """One tick, flattened for the table (``accepted``: ``rid``, ``rid (cut E)``, ``rid (cont E)``)."""

    tick: int
    accepted: str = outcome()
    admitted: int = metric(unit="requests", lower_is_better=False)
    stopped_on_rid: str | None = outcome()
    stopped_result: str = outcome()
    stopped_budget: str | None = outcome()
    stopped_where: str = outcome()
    log_hit_tokens: int = metric(unit="tokens", lower_is_better=False)
    log_input_tokens: int = metric(unit="tokens", lower_is_better=False)
    cp_total_extend_tokens: int = metric(unit="tokens", lower_is_better=False)
    cp_total_cached_tokens: int = metric(unit="tokens", lower_is_better=False)
    loaded_tokens: int = metric(unit="tokens", lower_is_better=False)
    evicted_tokens: int = metric(unit="tokens")
    allocator_available_after_tick: int = metric(unit="tokens", lower_is_better=False)
    evictable_after_tick: int = metric(unit="tokens", lower_is_better=False)
    rem_total_tokens: float = metric(unit="tokens", lower_is_better=False)
    cur_rem_tokens: int = metric(unit="tokens", lower_is_better=False)
    rem_input_tokens: int = metric(unit="tokens", lower_is_better=False)
    rem_chunk_tokens: int | None = metric(unit="tokens", lower_is_better=False)
    decisions: int = metric(unit="calls")
    duration_us: float = metric(unit="us", timing=True)


TABLE_COLUMNS = (
    "tick", "accepted", "stopped_on_rid", "stopped_result", "stopped_budget", "log_hit_tokens",
    "log_input_tokens", "cp_total_extend_tokens", "cp_total_cached_tokens", "loaded_tokens",
    "allocator_available_after_tick", "rem_total_tokens",
)  # fmt: skip


SUMMARY_DIRECTIONS = {
    "ticks": "lower",  # passes to admit the same queue
    "requests_admitted": "higher",
    "requests_waiting": "lower",
    "decisions": "neutral",  # add_one_req calls: the model's work, not an outcome
    "first_batch_requests": "neutral",
}
"""How ``cpkv diff`` judges the summary numbers of a passes run (others are ``changed``)."""


def tick_row(t: TickRecord) -> TickRow:
    """The table row of one tick."""
    names = []
    for a in t.accepted:
        if a.continuation:
            names.append(f"{a.rid} (cont {a.extend_tokens})")
        elif a.chunked:
            names.append(f"{a.rid} (cut {a.extend_tokens})")
        else:
            names.append(a.rid)
    return TickRow(
        tick=t.tick,
        accepted=", ".join(names),
        admitted=sum(not a.continuation for a in t.accepted),
        stopped_on_rid=t.stopped_on_rid,
        stopped_result=t.stopped_result,
        stopped_budget=t.stopped_budget,
        stopped_where=t.stopped_where,
        log_hit_tokens=t.log_hit_tokens,
        log_input_tokens=t.log_input_tokens,
        cp_total_extend_tokens=t.cp_total_extend_tokens,
        cp_total_cached_tokens=t.cp_total_cached_tokens,
        loaded_tokens=sum(e.loaded_tokens for e in t.load_back_events),
        evicted_tokens=sum(e.evicted_tokens for e in t.load_back_events),
        allocator_available_after_tick=t.allocator_available_after_tick,
        evictable_after_tick=t.evictable_after_tick,
        rem_total_tokens=t.rem_total_tokens,
        cur_rem_tokens=t.cur_rem_tokens,
        rem_input_tokens=t.rem_input_tokens,
        rem_chunk_tokens=t.rem_chunk_tokens,
        decisions=t.decisions,
        duration_us=t.duration_us,
    )


def ticks_jsonl(result: AdmitResult) -> str:
    """Every field of every tick, one JSON object per line."""
    return "".join(json.dumps(to_dict(t), separators=(",", ":")) + "\n" for t in result.ticks)


def prepare_passes(cfg: AdmitConfig) -> Callable[[RunContext], RunOutput]:
    """Check the backend and read the workload (user errors surface here), then run."""
    block = cfg.admit
    budgets = block.budgets()
    if block.backend == "sglang":
        from cpkv.admission.sglang.backend import check_supported

        check_supported(budgets)
    with Stopwatch() as loading:
        requests = load_workload(block.workload, seed=cfg.seed)

    def execute(ctx: RunContext) -> RunOutput:
        ctx.report(0, 1, f"{len(requests)} requests through {block.backend}")
        with Stopwatch() as running:
            result = run_admission(requests, budgets, block.backend)
        ctx.report(1, 1, "done")
        timing = timing_summary(result.summary.decisions, loading.elapsed, running.elapsed)
        summary = {
            "backend": block.backend,
            "policy": block.policy,
            "workload": block.workload.source,
        }
        summary.update((k, v) for k, v in to_dict(result.summary).items() if k != "backend")
        summary["timing"] = timing  # wall-clock and CPU numbers: they vary run to run
        s = result.summary
        first = len(result.ticks[0].accepted) if result.ticks else 0
        summary["headline"] = {  # what sweeps and `cpkv ls` show for this run
            "ticks": s.ticks, "requests_admitted": s.requests_admitted, "first_batch_requests": first,
        }  # fmt: skip
        return RunOutput(
            rows=[tick_row(t) for t in result.ticks],
            summary=summary,
            extras={"ticks.jsonl": ticks_jsonl(result)},
            table_columns=TABLE_COLUMNS,
            notes=[*_notes(cfg), *_stall_note(cfg, result), timing_note(s.decisions, timing)],
            summary_directions=SUMMARY_DIRECTIONS,
        )

    return execute


def _stall_note(cfg: AdmitConfig, result: AdmitResult) -> list[str]:
    """Why the run ended with requests still waiting (its last tick admitted nothing)."""
    waiting = result.summary.requests_waiting
    if not waiting or not result.ticks:
        return []
    last = result.ticks[-1]
    why = f"request {last.stopped_on_rid} stopped on {last.stopped_budget or last.stopped_result}"
    fix = (
        "even with release_each_tick it does not fit the budgets, so it can never be admitted"
        if cfg.admit.release_each_tick
        else "nothing is released between ticks, so no later tick could admit more; "
        "admit.release_each_tick=true frees each tick's finished prompts"
    )
    still = f"{waiting} requests still wait" if waiting > 1 else "1 request still waits"
    return [f"stopped after tick {last.tick}, which admitted nothing: {still} ({why}); {fix}"]


def _notes(cfg: AdmitConfig) -> list[str]:
    b = cfg.admit
    cp = b.cp
    notes = [
        "every tick is a fresh PrefillAdder pass over the waiting queue (sglang 0.5.23 semantics); "
        + ("finished requests release their L1 tokens between ticks" if b.release_each_tick
           else "nothing is released between ticks (only L2 load-back takes allocator slots)"),
    ]  # fmt: skip
    if cp.active:
        limits = {
            "extend tokens": cp.max_total_extend_tokens,
            "cached tokens": cp.max_total_cached_tokens,
            "requests": cp.max_batch_requests,
        }
        shown = ", ".join(f"{v} {k}" for k, v in limits.items() if v is not None)
        notes.append(f"CP shared-KV limits per batch (page-aligned sums): {shown}")
    notes.append("ticks.jsonl holds every field of every tick, load-back events included")
    return notes
