"""``cpkv admit`` with ``admit.mode: serving``: read, fit, simulate, write.

``results.json`` holds one :class:`~cpkv.serving.metrics.ServingRow` (the headline
metrics, so that ``cpkv diff`` compares two runs or two sweep points metric by metric);
``requests.jsonl`` one line per request; ``timeline.jsonl`` the KV utilisation and where the
time went (:mod:`cpkv.serving.cost.report`) over time; ``plots/`` the KV timeline and the
TTFT/TPOT CDFs when matplotlib is importable.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from cpkv.admission.token_ratio import NewTokenRatio
from cpkv.core.kinds import RunContext
from cpkv.core.schema import to_dict
from cpkv.runs.results import RunOutput
from cpkv.serving.adder import AdderBudgets
from cpkv.serving.cost.fit import fit_cost, read_points
from cpkv.serving.cost.report import cost_note, time_note
from cpkv.serving.graph_padding import PaddedDecodeCost
from cpkv.serving.helper import Helper, Producer, helper_wanted
from cpkv.serving.iteration_log import IterationLog
from cpkv.serving.loop import Sim, SimSettings
from cpkv.serving.metrics import TABLE_COLUMNS, RequestStats, row_of
from cpkv.serving.policy_options import options_from
from cpkv.serving.timeline import timeline_and_time
from cpkv.serving.workload import load_serving_workload


@contextlib.contextmanager
def few_collections() -> Iterator[None]:
    """Python's cyclic garbage collector, rarely, while the loop runs: the objects that exist
    when it starts (modules, the workload, the run's setup) are frozen out of collections,
    and a collection of the youngest objects waits for 20,000 new ones instead of 700 (the
    loop makes a request object per request and almost no cycles: collections were time
    spent finding nothing). Restored after."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(20_000, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def settings_from(block: Any, cost: Any, seed: int = 0, cancellations: bool = False) -> SimSettings:
    """The loop's settings from the ``admit`` block (``cost``: possibly fitted; ``seed``: the
    experiment's, for ``schedule_policy: random``; ``cancellations``: requests carry
    ``cancel_ms``)."""
    kv, cp = block.kv, block.cp
    # issue 13: None when every policy key is a default and nothing is cancelled
    extra = options_from(block, seed, cancellations)
    if extra is not None and extra.cuda_graph_buckets:
        cost = PaddedDecodeCost(cost, extra.cuda_graph_buckets)
    limits = (
        (cp.max_batch_requests, cp.max_total_extend_tokens, cp.max_total_cached_tokens)
        if cp.active
        else (None, None, None)
    )
    adder = AdderBudgets(
        kv.block_size,
        block.max_prefill_tokens,
        block.chunk_tokens,
        block.max_running_requests,
        block.prefill_max_requests,
        block.load_back_threshold,
        *limits,
    )
    ratio = NewTokenRatio.from_settings(
        init_ratio=block.new_token_ratio,
        min_factor=block.serving.ratio_min_factor,
        decay_steps=block.serving.ratio_decay_steps,
    )
    return SimSettings(
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
        extra=extra,
    )


def prepare_serving(cfg: Any) -> Callable[[RunContext], RunOutput]:
    """Read the workload and the cost points (user errors surface here), then simulate."""
    block = cfg.admit
    workload = load_serving_workload(block.workload, block.max_new_tokens, cfg.seed)
    fit = None
    cost = block.cost.build()
    if block.cost.fit_points is not None:
        fit = fit_cost(read_points(block.cost.fit_points), cost)
        cost = fit.model
    cancellations = any(r.cancel_ms is not None for r in workload.requests)
    settings = settings_from(block, cost, cfg.seed, cancellations)

    def execute(ctx: RunContext) -> RunOutput:
        if block.cluster.instances > 1 or block.serving.trace_events:
            return _execute_cluster(ctx, block, settings, workload, cfg.seed, fit)
        count = workload.size
        ctx.report(0, 1, f"serving {count} requests, policy {block.policy}")
        cap, points = settings.capacity_blocks, block.serving.timeline_points
        lines = ctx.stream("requests.jsonl")  # written as requests end
        stats = RequestStats(block.slo, lines.write)
        samples = IterationLog(
            cap, settings.block_size, keep=False, spill_dir=ctx.run_dir, cost=settings.cost
        )
        helped = helper_wanted(count, lines)
        producer = None
        if helped and workload.lazy:  # drawn on the other core, built here
            producer = Producer(workload.arrival_rows(block.arrivals, cfg.seed))
        arriving = workload.arriving(block.arrivals, cfg.seed) if producer is None else None
        sim = Sim(
            settings, workload.new_cache(), sink=stats, samples=samples,
            arrivals=arriving if producer is None else iter(producer),
        )  # fmt: skip
        others = [] if producer is None else [producer.inbox]
        helper = Helper(stats, samples, lines, others) if helped else None
        try:
            with few_collections():
                res = sim.run()
            stats.close()
            if helper is not None:  # the output work ran on the other core
                done = helper.finish(res.end_us, cap, points)
                summary, integrals = done["summary"], done["integrals"]
                timeline, time = done["timeline"], done["time"]
            else:
                summary, integrals = stats.summary(), res.integrals
                timeline, time = timeline_and_time(samples, res.end_us, cap, points)
        except BaseException:
            if helper is not None:
                helper.abort()
            raise
        finally:
            if producer is not None:
                producer.close()
            samples.discard()
        ctx.report(1, 1, "done")
        row = row_of(summary, integrals, res.end_us, cap)
        policy = None
        if settings.extra is not None or block.serving.policy_metrics:  # issue 13
            from cpkv.serving.policy_metrics import policy_row, policy_summary

            policy = policy_summary(block, settings, sim, res, summary)
            row = policy_row(row, policy)
        return _output(
            block, settings, fit, count, lines, row, timeline, time,
            _summary(block, settings, res, summary, fit), res.counters, policy,
        )  # fmt: skip

    return execute


def _execute_cluster(
    ctx: RunContext, block: Any, settings: SimSettings, workload: Any, seed: int, fit: Any
) -> RunOutput:
    """Instances behind a router, or one with trace events (:mod:`cpkv.serving.cluster.serve`)."""
    from cpkv.serving.cluster.serve import cluster_note, instances_lines, serve_cluster

    n, count = block.cluster.instances, workload.size
    behind = f", {n} instances behind {block.cluster.router}" if n > 1 else ""
    ctx.report(0, 1, f"serving {count} requests, policy {block.policy}{behind}")
    lines = ctx.stream("requests.jsonl")  # written as requests end
    out = serve_cluster(block, settings, workload, seed, lines, ctx.run_dir)
    ctx.report(1, 1, "done")
    files = {"instances.jsonl": instances_lines(out.instance_rows)} if n > 1 else {}
    notes = [cluster_note(out.cluster)] if n > 1 else []
    if out.trace is not None:
        files["trace.json"] = out.trace
        notes.append(
            "trace.json: the run in the Chrome trace-event format (ui.perfetto.dev or chrome://tracing)"
        )
    return _output(
        block, settings, fit, count, lines, out.row, out.timeline, out.time,
        _summary(block, settings, out, out.summary, fit), out.counters, out.policy,
        files=files, cluster=out.cluster if n > 1 else None, more_notes=notes,
    )  # fmt: skip


def _output(
    block: Any,
    settings: SimSettings,
    fit: Any,
    count: int,
    lines: Any,
    row: Any,
    timeline: list[dict[str, Any]],
    time: dict[str, Any],
    summary: dict[str, Any],
    counters: dict[str, Any],
    policy: dict[str, Any] | None,
    *,
    files: dict[str, str] | None = None,
    cluster: dict[str, Any] | None = None,
    more_notes: Sequence[str] = (),
) -> RunOutput:
    """A serving run's output, one instance or a cluster: the row, the summary (``time``,
    the policy block, the cluster block), ``timeline.jsonl`` (``requests.jsonl`` when it was
    kept in memory) and ``files``, the notes."""
    extras = {
        "timeline.jsonl": "".join(json.dumps(p, separators=(",", ":")) + "\n" for p in timeline),
    }
    kept = lines.text()
    if kept is not None:  # no run directory: the lines were kept in memory
        extras = {"requests.jsonl": kept, **extras}
    extras.update(files or {})
    notes = _notes(block, settings, fit, time)
    too_big = counters["rejects"].get("exceeds_kv_capacity", 0)
    if too_big:
        cap = settings.capacity_blocks
        notes.append(
            f"{too_big} of {count} requests could never fit the KV pool even alone "
            f"(prompt + max_new > {cap} blocks x {settings.block_size} tokens): rejected; "
            "raise admit.kv.capacity_blocks or admit.kv.block_size"
        )
    notes.extend(more_notes)
    summary = {**summary, **({} if policy is None else {"policy_space": policy}), "time": time}
    if cluster is not None:
        summary["cluster"] = cluster
    return RunOutput(
        rows=[row],
        summary={**summary, "headline": _headline(row)},
        extras=extras,
        table_columns=TABLE_COLUMNS,
        notes=notes,
    )


def _headline(row: Any) -> dict[str, float]:
    """What sweeps and `cpkv ls` show for a serving run."""
    return {
        k: getattr(row, k)
        for k in ("goodput_requests_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms")
    }


def _summary(block: Any, s: SimSettings, res: Any, stats: Any, fit: Any) -> dict[str, Any]:
    c = res.counters
    out = {
        "mode": "serving",
        "policy": block.policy,
        "workload": block.workload.source,
        "arrivals": to_dict(block.arrivals),
        "kv_block_size": s.block_size,
        "kv_capacity_blocks": s.capacity_blocks,
        "kv_capacity_tokens": s.capacity_blocks * s.block_size,
        "rejected_by_reason": dict(sorted(c["rejects"].items())),
        "preemptions_by_reason": dict(sorted(c["preemptions"].items())),
        "admission_stops": c["admission_stops"],
        "admissions": c["admissions"],
        "prefill_tokens_computed": c["prefill_tokens"],
        "decode_tokens": c["decode_tokens"],
        "l1_hit_tokens": c["l1_hit_tokens"],
        "l2_loaded_tokens": c["loaded_tokens"],
        "recompute_bytes": stats.recomputed * s.cost.kv_bytes_per_token,
        "cost_model": s.cost.describe(),
        "slo": to_dict(block.slo),
    }
    if block.policy == "prefill_adder":
        out["final_new_token_ratio"] = c["final_new_token_ratio"]
    if fit is not None:
        out["cost_fit"] = fit.describe()
    return out


def _notes(block: Any, s: SimSettings, fit: Any, time: dict[str, Any]) -> list[str]:
    mapping = {
        "prefill_adder": "one SGLang PrefillAdder pass per iteration (mixed chunk: decode tokens first), adaptive new_token_ratio",
        "conservative": f"reserve ceil((prompt + max_new) / block) blocks ({s.scan}); prefill by admit.iteration's token budget",
        "optimistic": f"admit on prompt blocks ({s.scan}), preempt on growth; prefill by admit.iteration's token budget",
        "iteration": "admit FCFS when admit.iteration's token budget can start the prompt; preempt on growth",
        "profiled": "admit when prompt + a quantile of the finished output lengths fits beside the outstanding reservations (admit.profiled); prefill by admit.iteration's token budget",
    }
    notes = [
        f"serving simulation, policy {block.policy}: {mapping[block.policy]}",
        f"KV pool {s.capacity_blocks} blocks x {s.block_size} tokens (admit.kv); the L1 prefix cache is a separate partition; "
        f"growth preempts by victim order {s.victim}, victims "
        + {
            "requeue": "re-queue (recompute)",
            "swap": "re-queue (KV swapped to host and back)",
            "abort": "are aborted",
        }[s.on_preempt],
    ]
    if block.policy == "prefill_adder" and s.adder.cp_on:
        notes.append("CP shared-KV limits apply to each iteration's prefill batch (admit.cp)")
    coef = s.cost.describe()
    shown = ", ".join(f"{k}={v}" for k, v in coef.items())
    if s.cost.kind == "roofline":
        notes.append(cost_note(s.cost))
    elif fit is None:
        notes.append(f"cost model (illustrative defaults unless set): {shown}")
    else:
        notes.append(
            f"cost model fitted to {fit.points} points of {block.cost.fit_points}: {shown}; rms error "
            f"{fit.rms_error_us:.1f} us, mean relative error {fit.mean_rel_error_pct:.2f}%, r2 {fit.r2:.4f}"
        )
    notes.append(
        "admit.available_tokens, evictable_tokens, page_size, running and release_each_tick describe the "
        "passes mode's snapshot and are not read here (the pool and its page are admit.kv)"
    )
    notes.append(time_note(time))
    notes.append(
        "requests.jsonl: one line per request; timeline.jsonl: KV utilisation and where the time went over time"
    )
    return notes
