"""A serving run of several instances behind a router (``admit.cluster``), or of one with
trace events: the instances, their outputs, per instance and in total.

In total: the summary row over every request (:class:`~cpkv.serving.record.metrics.ServingRow`; the
KV percentages over the instances' pools together, the peak the highest instance's, the
inter-token latency over every instance's token gaps),
``requests.jsonl`` in input order with each line's ``instance`` (when there are several),
``timeline.jsonl`` with one series per instance (each point with its ``instance``; one
instance: the plain run's). Per instance (the summary's ``cluster.per_instance`` and
``instances.jsonl``): its row over the requests it served (the makespan is the cluster's),
its L1 and L2 hit ratios (hit tokens of the requests it admitted over their prompt tokens),
its work (the time its iterations took, ``busy_s``). The cluster: the router's decisions by
rule, the requests the balance threshold moved, and the load imbalance (max / mean of the
instances' work; 1 is even).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cpkv.core.files.jsonl import json_lines
from cpkv.serving.cluster.driver import Cluster, InstanceColumns, InstanceTally, shared_l2_caches
from cpkv.serving.engine.clock import check_end
from cpkv.serving.engine.engine import Engine
from cpkv.serving.engine.sglang_engine import SglangEngine
from cpkv.serving.engine.vllm_engine import VllmEngine
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.serving.record.itl import ItlStats, itl_stats
from cpkv.serving.record.metrics import ServingRow, added_counts, log_report, row_of
from cpkv.serving.record.requests import RequestStats
from cpkv.serving.record.segments import Integrals
from cpkv.serving.record.trace.events import TraceEvents

INSTANCE_COLUMNS = (
    "routed", "finished", "slo_attainment_pct", "goodput_requests_per_s", "ttft_p50_ms",
    "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "l1_hit_pct", "l2_hit_pct", "busy_s",
    "kv_util_mean_pct", "preemptions",
)  # fmt: skip
"""What the summary's ``cluster.per_instance`` shows of each instance."""


@dataclass
class ClusterOutcome:
    """What the serving run writes of a cluster (see the module docstring)."""

    row: ServingRow
    summary: Any  # the total RequestSummary
    counters: dict[str, Any]  # the instances' counters, added up
    end_us: float
    timeline: list[dict[str, Any]]
    cluster: dict[str, Any]
    instance_rows: list[dict[str, Any]]
    time: dict[str, Any]  # the summary's time (where the time went), all instances together
    policy: dict[str, Any] | None  # the summary's policy_space, all instances together
    itl: ItlStats  # the token gaps of all instances together


def serve_cluster(
    block: Any, settings: Any, workload: Any, seed: int, lines: Any, spill_dir: Any,
    events: TraceEvents | None = None,
) -> ClusterOutcome:  # fmt: skip
    """Run ``block.cluster.instances`` instances of ``settings`` on ``workload``'s requests;
    ``lines``: where ``requests.jsonl`` goes (a stream with ``write``); ``events``: where the
    trace events go as they happen (none: no trace)."""
    spec = block.cluster
    n, cap, points = spec.instances, settings.capacity_blocks, block.serving.timeline_points
    total = RequestStats(block.slo, lines.write)
    engines, tallies, logs = _instances(block, settings, workload, total, events, spill_dir)
    block_tokens = workload.cache_block_size or settings.block_size
    cluster = Cluster(engines, tallies, spec.router, spec.router_settings(), seed, block_tokens)
    if n > 1:
        total.columns = InstanceColumns(cluster.instance_of)
    try:
        run = cluster.run(workload.arriving(block.arrivals, seed))
        end = run.end_us
        check_end(end, workload.size)
        total.close()
        reports = [log_report(log, end, cap, points) for log in logs]
        itls = [itl_stats([log]) for log in logs] if n > 1 else []
        itl = itl_stats(logs)
    finally:
        for log in logs:
            log.discard()
    integrals = [r[0] for r in reports]
    timeline = [{"instance": k, **p} if n > 1 else p for k, r in enumerate(reports) for p in r[1]]
    times = [r[2] for r in reports]
    rows = []
    for k, (tally, part) in enumerate(zip(tallies, integrals, strict=True)):
        tally.own.close()
        rows.append(row_of(tally.own.summary(), part, end, cap, itls[k] if itls else itl))
    row = row_of(total.summary(), _added(integrals), end, cap * n, itl)
    if n > 1:  # the peak: the highest instance's (a sum of peaks is no peak of the sum)
        row = replace(row, kv_util_peak_pct=max(r.kv_util_peak_pct for r in rows))
    counters = _added_counters([res.counters for res in run.results])
    policy = None
    if block.engine == "cpkv" and (settings.options is not None or block.serving.policy_metrics):
        from cpkv.serving.record.policy_metrics import policy_row

        policy = _policy_summary(block, settings, engines, counters, total.summary())
        row = policy_row(row, policy)
    instance_rows = _instance_rows(tallies, rows, times, run.results)
    return ClusterOutcome(
        row, total.summary(), counters, end, timeline,
        _cluster_summary(spec, run.router, tallies, instance_rows), instance_rows,
        _added_time(times), policy, itl,
    )  # fmt: skip


def _instances(
    block: Any, settings: Any, workload: Any, total: Any, events: Any, spill_dir: Any
) -> tuple[list[Engine], list[InstanceTally], list[IterationLog]]:
    """The instances: an engine each (cpkv's loop with its caches, one L2 shared when asked;
    SGLang's loop or vLLM's scheduler, their prefix caches in their own pools), the tally its
    requests end in, its iteration log and trace hooks."""
    spec, n = block.cluster, block.cluster.instances
    own = block.engine == "cpkv"  # (the other engines' prefix caches live in their pools)
    caches = [workload.new_cache() if own else None for _ in range(n)]
    if spec.shared_l2 and n > 1 and caches[0] is not None:
        l2 = caches[0].l2.capacity if caches[0].l2 is not None else None
        shared_l2_caches(caches, None if l2 is None else l2 * n)
    engines, tallies, logs = [], [], []
    for k in range(n):
        hooks = events.instance(k) if events is not None else None
        tally = InstanceTally(
            k, total, RequestStats(block.slo), on_done=None if hooks is None else hooks.request
        )
        log = IterationLog(
            settings.capacity_blocks, settings.block_size, keep=False, spill_dir=spill_dir,
            cost=settings.cost,
        )  # fmt: skip
        tallies.append(tally)
        logs.append(log)
        if block.engine == "vllm":
            engines.append(VllmEngine(settings, sink=tally, samples=log))
        elif block.engine == "sglang":
            engines.append(SglangEngine(settings, sink=tally, samples=log))
        else:
            engines.append(Engine(settings, caches[k], sink=tally, samples=log, trace=hooks))
    return engines, tallies, logs


def _instance_rows(
    tallies: list[Any], rows: list[Any], times: list[dict[str, Any]], results: list[Any]
) -> list[dict[str, Any]]:
    """``instances.jsonl``'s rows: each instance's summary row, hits and work."""
    out = []
    for k, (tally, r, t, res) in enumerate(zip(tallies, rows, times, results, strict=True)):
        out.append({
            "instance": k, "routed": tally.routed, **r.__dict__,
            "l1_hit_pct": _pct(tally.l1_hit_tokens, tally.prompt_tokens),
            "l2_hit_pct": _pct(tally.l2_hit_tokens, tally.prompt_tokens),
            "busy_s": round(t["busy_s"], 6), "end_s": res.end_us / 1e6,
        })  # fmt: skip
    return out


def _cluster_summary(
    spec: Any, router: Any, tallies: list[Any], instance_rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """The summary's ``cluster`` block (module docstring)."""
    n = len(tallies)
    busy = [x["busy_s"] for x in instance_rows]
    mean_busy = sum(busy) / n
    prompt = sum(t.prompt_tokens for t in tallies)
    return {
        "instances": n,
        "router": spec.router,
        "shared_l2": spec.shared_l2,
        "routed_by_rule": dict(sorted(router.by_rule.items())),
        "moved_by_balance": router.moved_by_balance,
        "load_imbalance": round(max(busy) / mean_busy, 4) if mean_busy > 0 else None,
        "requests_imbalance": round(
            max(t.routed for t in tallies) * n / max(1, sum(t.routed for t in tallies)), 4
        ),
        "l1_hit_pct": _pct(sum(t.l1_hit_tokens for t in tallies), prompt),
        "l2_hit_pct": _pct(sum(t.l2_hit_tokens for t in tallies), prompt),
        "per_instance": [{k: x[k] for k in ("instance", *INSTANCE_COLUMNS)} for x in instance_rows],
    }


def _policy_summary(
    block: Any, settings: Any, engines: list[Any], counters: dict[str, Any], summary: Any
) -> dict[str, Any]:
    """The summary's ``policy_space`` of all instances: the policy machinery's counts added
    up; a ``profiled`` run's final quantile per instance (one: its own)."""
    from cpkv.serving.record.policy_metrics import policy_counts, policy_summary

    counts = added_counts([policy_counts(e) for e in engines])
    quantiles = None
    if block.policy == "profiled":
        quantiles = [e.scheduler.estimator.value() for e in engines]
    return policy_summary(block, settings, counts, counters, summary, quantiles)


def _added_time(times: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's ``time`` of the instances together (each over the cluster's makespan):
    seconds added, shares of the busy time recomputed, MFU over all GPUs (one: its own)."""
    if len(times) == 1:
        return times[0]
    n = len(times)
    out: dict[str, Any] = {}
    busy = sum(t["busy_s"] for t in times)
    for key in times[0]:
        if key.endswith("_s") or key == "model_tflop":
            values = [t[key] for t in times]
            out[key] = None if None in values else round(sum(values), 6)
    shares = [t["busy_pct"] for t in times]
    out["busy_pct"] = None if None in shares else round(sum(shares) / n, 4)
    for key in times[0]:
        if key.endswith("_pct") and key not in ("busy_pct", "mfu_pct", "mfu_busy_pct"):
            part = out.get(key[: -len("_pct")] + "_s")
            out[key] = None if part is None or busy <= 0 else round(100.0 * part / busy, 4)
    mfu = [t.get("mfu_pct") for t in times]
    out["mfu_pct"] = None if None in mfu else round(sum(mfu) / n, 4)
    mfu_busy = [t.get("mfu_busy_pct") for t in times]
    out["mfu_busy_pct"] = (
        None
        if None in mfu_busy or busy <= 0
        else round(sum(m * t["busy_s"] for m, t in zip(mfu_busy, times, strict=True)) / busy, 4)
    )
    return {key: out.get(key) for key in times[0]}


def _pct(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 4) if whole else None


def _added(parts: list[Integrals]) -> Integrals:
    """The instances' integrals together (one instance: its own)."""
    if len(parts) == 1:
        return parts[0]
    return Integrals(
        iterations=sum(p.iterations for p in parts),
        used_block_us=sum(p.used_block_us for p in parts),
        held_block_us=sum(p.held_block_us for p in parts),
        used_sum=sum(p.used_sum for p in parts),
        held_sum=sum(p.held_sum for p in parts),
        used_peak=max(p.used_peak for p in parts),
    )


def _added_counters(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Counters added up: numbers summed, counts by name merged and sorted, the final ratio
    None (one per instance: no total; one instance: its own counters)."""
    if len(parts) == 1:
        return parts[0]
    out = added_counts(parts)
    out["final_new_token_ratio"] = None
    return {k: dict(sorted(v.items())) if isinstance(v, dict) else v for k, v in out.items()}


def instances_lines(rows: list[dict[str, Any]]) -> str:
    """``instances.jsonl``: one line per instance."""
    return json_lines(rows, "instances.jsonl")


def cluster_note(c: dict[str, Any]) -> str:
    """One line of the cluster, for the run's notes."""
    per = "; ".join(
        f"{x['instance']}: {x['routed']} routed, {x['slo_attainment_pct']:.1f}% within the SLO, "
        f"hits L1 {x['l1_hit_pct'] or 0:.1f}% L2 {x['l2_hit_pct'] or 0:.1f}%, busy {x['busy_s']:.1f} s"
        for x in c["per_instance"]
    )
    moved = (
        f", {c['moved_by_balance']} requests moved by the balance threshold"
        if c["router"] == "prefix_aware"
        else ""
    )
    shared = " (one shared L2)" if c["shared_l2"] else ""
    return (
        f"{c['instances']} instances behind {c['router']}{shared}: load imbalance "
        f"{c['load_imbalance']} (max / mean busy time){moved}; prefix hits L1 "
        f"{c['l1_hit_pct'] or 0:.1f}% L2 {c['l2_hit_pct'] or 0:.1f}% of the prompt tokens; per "
        f"instance (instances.jsonl) {per}"
    )
