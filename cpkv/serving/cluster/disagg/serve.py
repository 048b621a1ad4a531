"""A disaggregated serving run (``admit.cluster.prefill`` and ``decode``): its pools, its
link, its outputs.

Each pool's instances are cpkv's serving loop with the pool's settings
(:func:`pool_settings`: the run's ``admit`` block with the pool's KV pool, budgets and cost
replaced); the prefill instances keep the run's prefix cache (L1 and L2 each, or one L2
shared when ``admit.cluster.shared_l2``), the decode instances none.

The outputs: the summary row over every request (a request's TTFT ends when a decode
instance takes it in; its TPOT is the decode side's; the KV percentages are over both pools'
blocks together); ``requests.jsonl`` with each line's handoff
(:class:`~cpkv.serving.cluster.disagg.tallies.HandoffColumns`); ``timeline.jsonl`` with one
series per instance (each point with its ``pool`` and ``instance``); ``instances.jsonl``,
one line per instance; the summary's ``disaggregation`` block: per pool its instances,
GPUs, router decisions, busy time (its iterations' time, summed; the share of the makespan
averaged over its instances) and KV utilisation; the link: sends, bytes, wire time and
utilisation (averaged over the prefill instances' links); the TTFT split (queue, prefill,
transfer, decode wait: mean, p50, p99).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cpkv.core.errors import ConfigError
from cpkv.serving.cluster.disagg.driver import Disaggregated
from cpkv.serving.cluster.disagg.link import Link
from cpkv.serving.cluster.disagg.schema import pool_cost, pool_gpus
from cpkv.serving.cluster.disagg.tallies import HandoffColumns, HandoffRecord, PrefillTally
from cpkv.serving.cluster.driver import Cluster, InstanceTally, shared_l2_caches
from cpkv.serving.cluster.serve import ClusterOutcome, _added, _added_counters, _added_time, _pct
from cpkv.serving.engine.clock import check_end
from cpkv.serving.engine.engine import Engine
from cpkv.serving.engine.handoff import BuiltRequests
from cpkv.serving.engine.settings import EngineSettings, settings_from
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.serving.record.itl import ItlStats, itl_stats
from cpkv.serving.record.metrics import log_report, row_of
from cpkv.serving.record.requests import RequestStats

DECODE_COLUMNS = (
    "routed", "finished", "slo_attainment_pct", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
    "tpot_p99_ms", "busy_s", "kv_util_mean_pct", "preemptions",
)  # fmt: skip
PREFILL_COLUMNS = ("routed", "handed_off", "l1_hit_pct", "l2_hit_pct", "busy_s",
                   "kv_util_mean_pct", "link_bytes", "link_util_pct")  # fmt: skip


@dataclass(frozen=True)
class Pools:
    """Each pool's engine settings and GPUs per instance."""

    prefill: EngineSettings
    decode: EngineSettings
    prefill_gpus: int
    decode_gpus: int


def pool_settings(block: Any, cost: Any, seed: int, cancellations: bool = False) -> Pools:
    """Both pools' settings: the run's ``admit`` block with each pool's KV pool, budgets and
    cost (``cost``: the run's model, possibly fitted, for a pool that keeps ``admit.cost``);
    ConfigError when a pool would need the admission-policy options."""
    spec = block.cluster
    p, d = spec.prefill, spec.decode
    kv = block.kv

    def admit_of(pool: Any, **budgets: Any) -> Any:
        given = {k: v for k, v in budgets.items() if v is not None}
        blocks = pool.capacity_blocks or kv.capacity_blocks
        return replace(block, kv=replace(kv, capacity_blocks=blocks), **given)

    sides = (
        ("prefill", p, admit_of(p, max_prefill_tokens=p.max_prefill_tokens,
                                chunked_prefill_size=p.chunked_prefill_size)),
        ("decode", d, admit_of(d, max_running_requests=d.max_running_requests)),
    )  # fmt: skip
    out, gpus = [], []
    for name, pool, admit in sides:
        spec_cost = pool_cost(block.cost, pool, f"admit.cluster.{name}")
        own = cost if spec_cost is block.cost else spec_cost.build(block.engine)
        settings = settings_from(admit, own, seed, cancellations)
        if settings.options is not None:
            raise ConfigError(
                f"admit.cluster.{name}: a disaggregated deployment runs without cpkv's "
                "admission-policy options (schedule_policy, queue_timeout_ms, on_preempt swap, "
                "cuda_graph_buckets, check_invariants, policy_metrics, cancellations); leave "
                "them at their defaults"
            )
        out.append(settings)
        gpus.append(pool_gpus(spec_cost))
    if out[0].cost.kv_bytes_per_token != out[1].cost.kv_bytes_per_token:
        raise ConfigError(
            "admit.cluster: the prefill and decode pools hold the KV in different sizes "
            f"({out[0].cost.kv_bytes_per_token} and {out[1].cost.kv_bytes_per_token} bytes a "
            "token); both sides must run the same model and KV dtype"
        )
    return Pools(out[0], out[1], gpus[0], gpus[1])


def serve_disaggregated(
    block: Any, pools: Pools, workload: Any, seed: int, lines: Any, spill_dir: Any,
    events: Any = None,
) -> ClusterOutcome:  # fmt: skip
    """Run both pools on ``workload``'s requests (module docstring); ``lines``: where
    ``requests.jsonl`` goes; ``events``: where the trace events go (none: no trace)."""
    spec = block.cluster
    total = RequestStats(block.slo)
    record = HandoffRecord()
    trace = None if events is None else _trace(events, spec)
    prefill, p_logs = _prefill_side(block, pools, workload, total, trace, spill_dir, seed)
    decode, d_logs = _decode_side(block, pools, workload, total, record, trace, spill_dir, seed)
    total.write = lines.write
    total.columns = HandoffColumns(prefill.instance_of, decode.instance_of, record)
    bandwidth, latency = spec.link.numbers()
    lanes = min(pools.prefill_gpus, pools.decode_gpus)
    links = [Link.of(bandwidth, latency, lanes) for _ in prefill.sims]
    driver = Disaggregated(
        prefill, decode, links, pools.prefill.cost.kv_bytes_per_token, record,
        None if trace is None else trace.handoffs,
    )  # fmt: skip
    logs = [*p_logs, *d_logs]
    caps = [pools.prefill.capacity_blocks] * len(p_logs) + [pools.decode.capacity_blocks] * len(
        d_logs
    )
    try:
        run = driver.run(workload.arriving(block.arrivals, seed))
        end = run.end_us
        check_end(end, workload.size)
        total.close()
        points = block.serving.timeline_points
        reports = [log_report(log, end, cap, points) for log, cap in zip(logs, caps, strict=True)]
        itl = itl_stats(logs)  # (the decode side's gaps: a prefill instance decodes nothing)
        decode_itls = [itl_stats([log]) for log in d_logs]
    finally:
        for log in logs:
            log.discard()
    return _outcome(
        block, pools, prefill, decode, run, reports, caps, total, record, links, itl, decode_itls
    )  # fmt: skip


def _prefill_side(
    block: Any, pools: Pools, workload: Any, total: Any, trace: Any, spill_dir: Any, seed: int
) -> tuple[Cluster, list[IterationLog]]:
    spec, settings = block.cluster, pools.prefill
    n = spec.prefill.instances
    caches = [workload.new_cache() for _ in range(n)]
    if spec.shared_l2 and n > 1 and caches[0] is not None:
        l2 = caches[0].l2.capacity if caches[0].l2 is not None else None
        shared_l2_caches(caches, None if l2 is None else l2 * n)
    sims, tallies, logs = [], [], []
    for k in range(n):
        hooks = None if trace is None else trace.instance(k)
        tally = PrefillTally(k, total, on_done=None if hooks is None else hooks.request)
        log = _log(settings, spill_dir)
        sims.append(Engine(settings, caches[k], sink=tally, samples=log, trace=hooks))
        tallies.append(tally)
        logs.append(log)
    block_tokens = workload.cache_block_size or settings.block_size
    cluster = Cluster(
        sims, tallies, spec.prefill.router, spec.router_settings(), seed, block_tokens
    )
    return cluster, logs


def _decode_side(
    block: Any, pools: Pools, workload: Any, total: Any, record: HandoffRecord, trace: Any,
    spill_dir: Any, seed: int,
) -> tuple[Cluster, list[IterationLog]]:  # fmt: skip
    spec, settings = block.cluster, pools.decode
    n, first = spec.decode.instances, spec.prefill.instances
    sims, tallies, logs = [], [], []
    for k in range(n):
        hooks = None if trace is None else trace.instance(first + k)
        on_done = record.taken_in if hooks is None else _both(record.taken_in, hooks.request)
        tally = InstanceTally(k, total, RequestStats(block.slo), on_done=on_done)
        log = _log(settings, spill_dir)
        sim = Engine(settings, None, sink=tally, samples=log, trace=hooks)
        sim.decode_side(
            BuiltRequests(
                spec.decode.reserved_decode_tokens, settings.adder.max_running_requests,
                settings.block_size, settings.capacity_blocks,
            )
        )  # fmt: skip
        sims.append(sim)
        tallies.append(tally)
        logs.append(log)
    block_tokens = workload.cache_block_size or settings.block_size
    cluster = Cluster(
        sims, tallies, spec.decode.router, spec.router_settings(), seed + 1, block_tokens
    )
    return cluster, logs


def _both(first: Any, second: Any) -> Any:
    def call(r: Any) -> None:
        first(r)
        second(r)

    return call


def _log(settings: EngineSettings, spill_dir: Any) -> IterationLog:
    return IterationLog(
        settings.capacity_blocks, settings.block_size, keep=False, spill_dir=spill_dir,
        cost=settings.cost,
    )  # fmt: skip


def _trace(events: Any, spec: Any) -> Any:
    from cpkv.serving.cluster.disagg.trace import DisaggTrace

    return DisaggTrace(events, spec.prefill.instances, spec.decode.instances)


def _outcome(
    block: Any, pools: Pools, prefill: Cluster, decode: Cluster, run: Any, reports: list[Any],
    caps: list[int], total: Any, record: HandoffRecord, links: list[Link], itl: ItlStats,
    decode_itls: list[ItlStats],
) -> ClusterOutcome:  # fmt: skip
    end = run.end_us
    n_p = len(prefill.sims)
    integrals = [r[0] for r in reports]
    times = [r[2] for r in reports]
    timeline = []
    for k, r in enumerate(reports):
        pool, instance = ("prefill", k) if k < n_p else ("decode", k - n_p)
        timeline.extend({"pool": pool, "instance": instance, **p} for p in r[1])
    rows = []
    for k, tally in enumerate(decode.tallies):
        tally.own.close()
        own = tally.own.summary()
        rows.append(row_of(own, integrals[n_p + k], end, caps[n_p + k], decode_itls[k]))
    summary = total.summary()
    row = row_of(summary, _added(integrals), end, sum(caps), itl)
    peaks = [100.0 * part.used_peak / cap for part, cap in zip(integrals, caps, strict=True)]
    row = replace(row, kv_util_peak_pct=max(peaks))
    results = [*run.prefill_results, *run.decode_results]
    counters = _added_counters([res.counters for res in results])
    instance_rows = _prefill_rows(prefill, integrals, times, caps, links, end) + _decode_rows(
        decode, rows, times[n_p:]
    )
    disagg = _disagg_summary(block, pools, prefill, decode, instance_rows, links, record, end)
    return ClusterOutcome(
        row, summary, counters, end, timeline, disagg, instance_rows, _added_time(times), None,
        itl,
    )  # fmt: skip


def _prefill_rows(
    prefill: Cluster, integrals: list[Any], times: list[Any], caps: list[int], links: list[Link],
    end: float,
) -> list[dict[str, Any]]:  # fmt: skip
    out = []
    for k, (tally, link) in enumerate(zip(prefill.tallies, links, strict=True)):
        used = integrals[k].used_block_us
        out.append({
            "pool": "prefill", "instance": k, "routed": tally.routed, "handed_off": tally.handed,
            "ended_here": tally.ended - tally.handed,
            "l1_hit_pct": _pct(tally.l1_hit_tokens, tally.prompt_tokens),
            "l2_hit_pct": _pct(tally.l2_hit_tokens, tally.prompt_tokens),
            "busy_s": round(times[k]["busy_s"], 6),
            "kv_util_mean_pct": round(100.0 * used / (caps[k] * end), 4) if end > 0 else 0.0,
            "link_sends": link.sends, "link_bytes": link.bytes_sent,
            "link_busy_s": round(link.busy_us / 1e6, 6),
            "link_util_pct": round(100.0 * link.busy_us / end, 4) if end > 0 else 0.0,
        })  # fmt: skip
    return out


def _decode_rows(decode: Cluster, rows: list[Any], times: list[Any]) -> list[dict[str, Any]]:
    out = []
    for k, (tally, r, t) in enumerate(zip(decode.tallies, rows, times, strict=True)):
        built = decode.sims[k].built
        out.append({
            "pool": "decode", "instance": k, "routed": tally.routed, "taken_in": built.admitted,
            **r.__dict__, "busy_s": round(t["busy_s"], 6),
        })  # fmt: skip
    return out


def _pool_block(rows: list[dict[str, Any]], name: str, spec: Any, gpus: int, router: Any,
                end: float) -> dict[str, Any]:  # fmt: skip
    mine = [x for x in rows if x["pool"] == name]
    busy = [x["busy_s"] for x in mine]
    kv = [x["kv_util_mean_pct"] for x in mine]
    return {
        "instances": len(mine),
        "gpus_per_instance": gpus,
        "gpus": gpus * len(mine),
        "router": spec.router,
        "routed_by_rule": dict(sorted(router.stats.by_rule.items())),
        "busy_s": round(sum(busy), 6),
        "busy_pct": round(100.0 * sum(busy) * 1e6 / (end * len(mine)), 4) if end > 0 else None,
        "kv_util_mean_pct": round(sum(kv) / len(kv), 4),
        "per_instance": [
            {
                k: x[k]
                for k in ("instance", *(PREFILL_COLUMNS if name == "prefill" else DECODE_COLUMNS))
            }
            for x in mine
        ],  # fmt: skip
    }


def _disagg_summary(
    block: Any, pools: Pools, prefill: Cluster, decode: Cluster, rows: list[dict[str, Any]],
    links: list[Link], record: HandoffRecord, end: float,
) -> dict[str, Any]:  # fmt: skip
    spec = block.cluster
    bandwidth, latency = spec.link.numbers()
    lanes = min(pools.prefill_gpus, pools.decode_gpus)
    sent = sum(link.bytes_sent for link in links)
    busy = sum(link.busy_us for link in links)
    p = _pool_block(rows, "prefill", spec.prefill, pools.prefill_gpus, prefill, end)
    d = _pool_block(rows, "decode", spec.decode, pools.decode_gpus, decode, end)
    return {
        "deployment": f"{p['instances']}P{d['instances']}D",
        "gpus": p["gpus"] + d["gpus"],
        "prefill": {
            **p,
            "kv_capacity_blocks": pools.prefill.capacity_blocks,
            "shared_l2": spec.shared_l2,
        },
        "decode": {
            **d,
            "kv_capacity_blocks": pools.decode.capacity_blocks,
            "reserved_decode_tokens": spec.decode.reserved_decode_tokens,
        },
        "link": {
            "kind": spec.link.kind,
            "gb_per_s_per_lane": bandwidth,
            "lanes": lanes,
            "latency_us": latency,
            "sends": sum(link.sends for link in links),
            "bytes": sent,
            "kv_bytes_per_token": pools.prefill.cost.kv_bytes_per_token,
            "busy_s": round(busy / 1e6, 6),
            "util_pct": round(100.0 * busy / (end * len(links)), 4) if end > 0 else None,
        },
        "ttft_split_ms": record.split_summary(),
    }


def disagg_note(c: dict[str, Any]) -> str:
    """One line of the deployment, for the run's notes."""
    p, d, link, split = c["prefill"], c["decode"], c["link"], c["ttft_split_ms"]
    parts = ", ".join(
        f"{name} {v['mean_ms']:.1f}" for name, v in split.items() if v["mean_ms"] is not None
    )
    rate = "unbounded" if link["gb_per_s_per_lane"] is None else (
        f"{link['gb_per_s_per_lane']:g} GB/s x {link['lanes']}")  # fmt: skip
    return (
        f"{c['deployment']} on {c['gpus']} GPUs: prefill pool {p['instances']} x "
        f"{p['gpus_per_instance']} GPUs behind {p['router']} (busy {_share(p['busy_pct'])} of "
        f"the makespan, KV {_share(p['kv_util_mean_pct'])}), decode pool {d['instances']} x "
        f"{d['gpus_per_instance']} GPUs behind {d['router']} (busy {_share(d['busy_pct'])}, KV "
        f"{_share(d['kv_util_mean_pct'])}); link {link['kind']} ({rate}, {link['latency_us']:g} "
        f"us): {link['sends']} sends, {link['bytes'] / 1e9:.2f} GB, {_share(link['util_pct'])} "
        f"busy; TTFT split (mean ms) {parts}; per instance: instances.jsonl"
    )


def _share(pct: float | None) -> str:
    return "-" if pct is None else f"{pct:.1f}%"
