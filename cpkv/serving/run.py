"""``cpkv admit`` with ``admit.mode: serving``: read, fit, simulate, write.

``results.json`` holds one :class:`~cpkv.serving.record.metrics.ServingRow` (the headline
metrics, so that ``cpkv diff`` compares two runs or two sweep points metric by metric) and
the summary (the inter-token latency under ``itl_ms``, :mod:`cpkv.serving.record.itl`);
``requests.jsonl`` one line per request; ``timeline.jsonl`` the KV utilisation and where the
time went (:mod:`cpkv.serving.cost.report`) over time; ``plots/`` the KV timeline and the
TTFT/TPOT CDFs when matplotlib is importable.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from cpkv.core.files.jsonl import json_lines
from cpkv.core.kinds import RunContext
from cpkv.core.schema import to_dict
from cpkv.runs.results import RunOutput
from cpkv.serving.cost.fitting.linear import fit_cost, read_points
from cpkv.serving.cost.report import cost_note, time_note
from cpkv.serving.engine.clock import check_arrivals, check_conserved, check_end
from cpkv.serving.engine.engine import Engine
from cpkv.serving.engine.settings import EngineSettings, settings_from, with_lane_pool
from cpkv.serving.engine_choice import chosen_engine
from cpkv.serving.input.workload import load_serving_workload
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.serving.record.itl import ItlStats, itl_stats
from cpkv.serving.record.metrics import TABLE_COLUMNS, log_report, row_of
from cpkv.serving.record.requests import RequestStats

__all__ = ["prepare_serving", "settings_from"]


@contextlib.contextmanager
def few_collections() -> Iterator[None]:
    """Python's cyclic garbage collector, rarely, while the engine runs: the objects that
    exist when it starts (modules, the workload, the run's setup) are frozen out of
    collections, and a collection of the youngest objects waits for 20,000 new ones instead
    of 700 (the engine makes a request object per request and almost no cycles: collections
    were time spent finding nothing). Restored after."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(20_000, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def prepare_serving(cfg: Any) -> Callable[[RunContext], RunOutput]:
    """Read the workload and the cost points (user errors surface here), then simulate."""
    workload = load_serving_workload(cfg.admit.workload, cfg.admit.max_new_tokens, cfg.seed)
    block, why = chosen_engine(with_lane_pool(cfg.admit), workload)
    check_arrivals(workload, block.arrivals)
    execute = _prepare(cfg, block, workload)
    if why is None:
        return execute
    note = (
        f"engine cpkv (cpkv's loop): SGLang's own loop (admit.engine sglang) cannot run this "
        f"config: {why}"
    )

    def with_note(ctx: RunContext) -> RunOutput:
        out = execute(ctx)
        return replace(out, notes=[note, *out.notes])

    return with_note


def _prepare(cfg: Any, block: Any, workload: Any) -> Callable[[RunContext], RunOutput]:
    fit = None
    cost = block.cost.build(block.engine)
    if block.cost.fit_points is not None:
        fit = fit_cost(read_points(block.cost.fit_points), cost, block.cost.fit_points)
        cost = fit.model
    if block.engine == "vllm":
        from cpkv.serving.engine.vllm_engine import vllm_settings_from

        vllm = vllm_settings_from(block, cost, workload)
        if block.cluster.instances > 1:
            return lambda ctx: _execute_cluster(ctx, block, vllm, workload, cfg.seed, fit)
        return lambda ctx: _execute_instance(ctx, block, vllm, workload, cfg.seed, fit)
    if block.engine == "sglang":
        from cpkv.serving.engine.sglang_engine import sglang_settings_from

        loop = sglang_settings_from(block, cost, workload, cfg.seed)
        if block.cluster.instances > 1:
            return lambda ctx: _execute_cluster(ctx, block, loop, workload, cfg.seed, fit)
        return lambda ctx: _execute_instance(ctx, block, loop, workload, cfg.seed, fit)
    cancellations = any(r.cancel_ms is not None for r in workload.requests)
    if block.cluster.disaggregated:
        from cpkv.serving.cluster.disagg.serve import pool_settings

        pools = pool_settings(block, cost, cfg.seed, cancellations)
        return lambda ctx: _execute_disaggregated(ctx, block, pools, workload, cfg.seed, fit)
    settings = settings_from(block, cost, cfg.seed, cancellations)

    def execute(ctx: RunContext) -> RunOutput:
        if block.cluster.instances > 1 or block.serving.trace_events:
            return _execute_cluster(ctx, block, settings, workload, cfg.seed, fit)
        return _execute_one(ctx, block, settings, workload, cfg.seed, fit)

    return execute


class Served(NamedTuple):
    """One instance's run and what its records say."""

    engine: Any
    result: Any
    summary: Any
    row: dict[str, Any]
    lines: Any
    timeline: Any
    time: Any
    itl: Any


def _serve(
    ctx: RunContext, block: Any, settings: Any, count: int, what: str,
    make_engine: Callable[[RequestStats, IterationLog], Any],
) -> Served:  # fmt: skip
    """Run one instance (``make_engine(sink, samples)``): its requests' lines written as they
    end, its iterations summed at the end, the requests counted in and out."""
    ctx.report(0, 1, f"serving {count} requests, {what}")
    cap, points = settings.capacity_blocks, block.serving.timeline_points
    lines = ctx.stream("requests.jsonl")  # written as requests end
    stats = RequestStats(block.slo, lines.write)
    samples = IterationLog(
        cap, settings.block_size, keep=False, spill_dir=ctx.run_dir, cost=settings.cost
    )
    engine = make_engine(stats, samples)
    try:
        with few_collections():
            res = engine.run()
        check_end(res.end_us, count)
        stats.close()
        integrals, timeline, time = log_report(samples, res.end_us, cap, points)
        itl = itl_stats([samples])
    finally:
        samples.discard()
    ctx.report(1, 1, "done")
    summary = stats.summary()
    check_conserved(count, summary.requests)
    row = row_of(summary, integrals, res.end_us, cap, itl)
    return Served(engine, res, summary, row, lines, timeline, time, itl)


def _execute_one(
    ctx: RunContext, block: Any, settings: EngineSettings, workload: Any, seed: int, fit: Any
) -> RunOutput:
    """One instance under cpkv's loop, with the admission-policy space's counts."""
    served = _serve(
        ctx, block, settings, workload.size, f"policy {block.policy}",
        lambda sink, samples: Engine(
            settings, workload.new_cache(), sink=sink, samples=samples,
            arrivals=workload.arriving(block.arrivals, seed),
        ),
    )  # fmt: skip
    row, policy = served.row, None
    if settings.options is not None or block.serving.policy_metrics:
        from cpkv.serving.record.policy_metrics import policy_counts, policy_row, policy_summary

        engine, res = served.engine, served.result
        quantiles = [engine.scheduler.estimator.value()] if block.policy == "profiled" else None
        counts = policy_counts(engine)
        policy = policy_summary(block, settings, counts, res.counters, served.summary, quantiles)
        row = policy_row(row, policy)
    return _served_output(block, settings, fit, workload.size, served, row, policy)


def _execute_instance(
    ctx: RunContext, block: Any, settings: Any, workload: Any, seed: int, fit: Any
) -> RunOutput:
    """One instance under a real engine's scheduler: vLLM's
    (:mod:`cpkv.serving.engine.vllm_engine`) or SGLang's loop
    (:mod:`cpkv.serving.engine.sglang_engine`)."""
    if block.engine == "vllm":
        from cpkv.serving.engine.vllm_engine import VllmEngine as Instance

        what = f"engine vllm (policy {block.vllm.policy})"
    else:
        from cpkv.serving.engine.sglang_engine import SglangEngine as Instance

        what = f"engine {block.engine}"
    served = _serve(
        ctx, block, settings, workload.size, what,
        lambda sink, samples: Instance(
            settings, sink=sink, samples=samples,
            arrivals=workload.arriving(block.arrivals, seed),
        ),
    )  # fmt: skip
    return _served_output(block, settings, fit, workload.size, served, served.row, None)


def _served_output(
    block: Any, settings: Any, fit: Any, count: int, served: Served, row: dict[str, Any],
    policy: Any,
) -> RunOutput:  # fmt: skip
    res, itl = served.result, served.itl
    return _output(
        block, settings, fit, count, served.lines, row, served.timeline, served.time,
        _summary(block, settings, res, served.summary, fit, itl), res.counters, policy,
    )  # fmt: skip


def _execute_cluster(
    ctx: RunContext, block: Any, settings: EngineSettings, workload: Any, seed: int, fit: Any
) -> RunOutput:
    """Instances behind a router, or one with trace events (:mod:`cpkv.serving.cluster.serve`)."""
    from cpkv.serving.cluster.serve import cluster_note, instances_lines, serve_cluster

    n, count = block.cluster.instances, workload.size
    behind = f", {n} instances behind {block.cluster.router}" if n > 1 else ""
    scheduler = f"policy {block.policy}" if block.engine == "cpkv" else f"engine {block.engine}"
    ctx.report(0, 1, f"serving {count} requests, {scheduler}{behind}")
    lines = ctx.stream("requests.jsonl")  # written as requests end
    events = None
    if block.serving.trace_events:  # written as events happen
        from cpkv.serving.record.trace.file import least_bytes, mb, open_trace

        events = open_trace(ctx.stream("trace.json").write, count, ctx.run_dir)
        ctx.report(0, 1, f"serving {count} requests; trace.json: at least {mb(least_bytes(count))}")
    out = serve_cluster(block, settings, workload, seed, lines, ctx.run_dir, events)
    check_conserved(count, out.summary.requests)
    ctx.report(1, 1, "done")
    files = {"instances.jsonl": instances_lines(out.instance_rows)} if n > 1 else {}
    notes = [cluster_note(out.cluster)] if n > 1 else []
    if events is not None:
        events.close()
        kept = ctx.streams["trace.json"].text()
        if kept is not None:  # no run directory: the file was kept in memory
            files["trace.json"] = kept
        notes.append(
            f"trace.json: the run in the Chrome trace-event format (ui.perfetto.dev or "
            f"chrome://tracing), {events.events:,} events, {mb(events.chars)}"
        )
    return _output(
        block, settings, fit, count, lines, out.row, out.timeline, out.time,
        _summary(block, settings, out, out.summary, fit, out.itl), out.counters, out.policy,
        files=files, cluster=out.cluster if n > 1 else None, more_notes=notes,
    )  # fmt: skip


def _execute_disaggregated(
    ctx: RunContext, block: Any, pools: Any, workload: Any, seed: int, fit: Any
) -> RunOutput:
    """A prefill pool and a decode pool (:mod:`cpkv.serving.cluster.disagg.serve`)."""
    from cpkv.serving.cluster.disagg.serve import disagg_note, serve_disaggregated
    from cpkv.serving.cluster.serve import instances_lines

    spec, count = block.cluster, workload.size
    ctx.report(0, 1, f"serving {count} requests, {spec.prefill.instances}P{spec.decode.instances}D")
    lines = ctx.stream("requests.jsonl")
    events = None
    if block.serving.trace_events:
        from cpkv.serving.record.trace.file import least_bytes, mb, open_trace

        events = open_trace(ctx.stream("trace.json").write, count, ctx.run_dir)
        ctx.report(0, 1, f"serving {count} requests; trace.json: at least {mb(least_bytes(count))}")
    out = serve_disaggregated(block, pools, workload, seed, lines, ctx.run_dir, events)
    check_conserved(count, out.summary.requests)
    ctx.report(1, 1, "done")
    files = {"instances.jsonl": instances_lines(out.instance_rows)}
    notes = [disagg_note(out.cluster)]
    if events is not None:
        events.close()
        kept = ctx.streams["trace.json"].text()
        if kept is not None:
            files["trace.json"] = kept
        notes.append(
            f"trace.json: the run in the Chrome trace-event format (ui.perfetto.dev or "
            f"chrome://tracing), {events.events:,} events, {mb(events.chars)}"
        )
    output = _output(
        block, pools.prefill, fit, count, lines, out.row, out.timeline, out.time,
        _summary(block, pools.prefill, out, out.summary, fit, out.itl), out.counters, None,
        files=files, more_notes=notes,
    )  # fmt: skip
    output.summary["disaggregation"] = out.cluster
    return output


def _output(
    block: Any,
    settings: EngineSettings,
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
        "timeline.jsonl": json_lines(timeline, "timeline.jsonl"),
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


def _summary(
    block: Any, s: EngineSettings, res: Any, stats: Any, fit: Any, itl: ItlStats
) -> dict[str, Any]:
    c = res.counters
    out = {
        "mode": "serving",
        "engine": block.engine,
        "policy": block.vllm.policy if block.engine == "vllm" else block.policy,
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
        "itl_ms": itl.summary(),
        "cost_model": s.cost.describe(),
        "slo": to_dict(block.slo),
    }
    if block.engine == "vllm":
        out["vllm"] = {**to_dict(block.vllm), **_derived_vllm(s.config)}
    elif block.engine == "sglang":
        out["sglang"] = _sglang_arguments(s.config)
        out["final_new_token_ratio"] = c["final_new_token_ratio"]
    elif block.policy == "prefill_adder":
        out["final_new_token_ratio"] = c["final_new_token_ratio"]
    if fit is not None:
        out["cost_fit"] = fit.describe()
    return out


def _sglang_arguments(config: Any) -> dict[str, Any]:
    """The server arguments SGLang's loop ran with (given or derived)."""
    return {
        "max_total_num_tokens": config.max_total_num_tokens,
        "max_running_requests": config.max_running_requests,
        "context_len": config.context_len,
        "chunked_prefill_size": config.chunked_prefill_size,
        "max_prefill_tokens": config.max_prefill_tokens,
        "page_size": config.page_size,
        "enable_mixed_chunk": config.enable_mixed_chunk,
        "disable_overlap_schedule": not config.overlap,
        "disable_radix_cache": config.disable_radix_cache,
        "schedule_policy": config.schedule_policy,
        "schedule_conservativeness": config.schedule_conservativeness,
        "cp_limits": config.cp_limit is not None,
        "hicache_tokens": config.hicache_tokens,
        "load_back_threshold": config.load_back_threshold,
    }


def _derived_vllm(config: Any) -> dict[str, int]:
    """The vLLM knobs the run derived (``num_gpu_blocks``, ``max_model_len``)."""
    return {"num_gpu_blocks": config.num_gpu_blocks, "max_model_len": config.max_model_len}


SNAPSHOT_KEYS = (
    "available_tokens",
    "evictable_tokens",
    "page_size",
    "running",
    "release_each_tick",
)
"""The passes mode's snapshot of one instant, which a serving run does not read."""


def _snapshot_keys_set(block: Any) -> list[str]:
    """The snapshot keys ``block`` sets to other than their defaults."""
    default = type(block)()
    return [k for k in SNAPSHOT_KEYS if getattr(block, k) != getattr(default, k)]


def _notes(block: Any, s: Any, fit: Any, time: dict[str, Any]) -> list[str]:
    if block.engine == "vllm":
        notes = _vllm_notes(s)
    elif block.engine == "sglang":
        notes = _sglang_notes(s)
    else:
        notes = _cpkv_notes(block, s)
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
    snapshot = _snapshot_keys_set(block)
    if snapshot:
        notes.append(
            f"admit.{', '.join(snapshot)} describe the passes mode's snapshot and are not read "
            "here (the pool and its page are admit.kv)"
        )
    notes.append(time_note(time))
    notes.append(
        "requests.jsonl: one line per request; timeline.jsonl: KV utilisation and where the time went over time"
    )
    return notes


def _cpkv_notes(block: Any, s: EngineSettings) -> list[str]:
    mapping = {
        "prefill_adder": "one SGLang PrefillAdder pass per iteration (mixed chunk: decode tokens first), adaptive new_token_ratio",
        "conservative": f"reserve ceil((prompt + max_new) / block) blocks ({s.scan}); prefill by admit.iteration's token budget",
        "optimistic": f"admit on prompt blocks ({s.scan}), preempt on growth; prefill by admit.iteration's token budget",
        "iteration": "admit FCFS when admit.iteration's token budget can start the prompt; preempt on growth",
        "profiled": "admit when prompt + a quantile of the finished output lengths fits beside the outstanding reservations (admit.profiled); prefill by admit.iteration's token budget",
    }
    cp = block.cost.cp
    pool = (
        "admit.kv"
        if cp.l1_pages_per_rank is None
        else f"admit.cost.cp: the shared paged L1 pool's {cp.size} owner lanes of "
        f"{cp.l1_pages_per_rank} pages of {cp.page_size} tokens, round-robin owners, the "
        "fullest lane's pages"
    )
    notes = [
        f"serving simulation, engine cpkv (cpkv's loop), policy {block.policy}: "
        f"{mapping[block.policy]}",
        f"KV pool {s.capacity_blocks} blocks x {s.block_size} tokens ({pool}); the L1 prefix cache is a separate partition; "
        f"growth preempts by victim order {s.victim}, victims "
        + {
            "requeue": "re-queue (recompute)",
            "swap": "re-queue (KV swapped to host and back)",
            "abort": "are aborted",
        }[s.on_preempt],
    ]
    if block.policy == "prefill_adder" and s.adder.cp_on:
        notes.append("CP shared-KV limits apply to each iteration's prefill batch (admit.cp)")
    return notes


def _vllm_notes(s: Any) -> list[str]:
    from cpkv.vllm import VLLM_VERSION

    c = s.config
    return [
        f"serving simulation, engine vllm: vLLM {VLLM_VERSION}'s V1 scheduler step by step "
        f"(policy {c.policy}, max_num_batched_tokens {c.max_num_batched_tokens}, max_num_seqs "
        f"{c.max_num_seqs}, long_prefill_token_threshold {c.long_prefill_token_threshold}, "
        f"scheduler_reserve_full_isl {c.scheduler_reserve_full_isl}); admit.policy and "
        "SGLang's budgets are not read",
        f"KV pool {c.num_gpu_blocks} blocks x {c.block_size} tokens (admit.vllm; block 0 is "
        f"vLLM's null block), max_model_len {c.max_model_len}; prefix caching "
        + ("on, in the pool (LRU eviction)" if c.enable_prefix_caching else "off")
        + "; a preempted request recomputes",
    ]


def _sglang_notes(s: Any) -> list[str]:
    from cpkv.sglang import SGLANG_VERSION

    c = s.config
    return [
        f"serving simulation, engine sglang: SGLang {SGLANG_VERSION}'s scheduler loop "
        f"iteration for iteration ({'overlap' if c.overlap else 'normal'} loop, mixed chunk "
        f"{'on' if c.is_mixed_chunk else 'off'}, chunked_prefill_size "
        f"{c.chunked_prefill_size}, max_prefill_tokens {c.max_prefill_tokens}, "
        f"max_running_requests {c.max_running_requests}, schedule_policy {c.schedule_policy})",
        f"KV pool {c.max_total_num_tokens} tokens in pages of {c.page_size}; the radix cache "
        + ("is off" if c.disable_radix_cache else "shares the pool (evictable, LRU)")
        + "; decode retracts (recompute) when its next step does not fit; "
        + (
            "no host tier"
            if c.hicache_tokens is None
            else f"a host tier of {c.hicache_tokens} tokens (write-through, load-back of "
            f"hits of at least {c.load_back_threshold} tokens; cpkv's extension)"
        ),
    ]
