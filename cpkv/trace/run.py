"""Run the `trace_stats` and `trace_curve` kinds: read the trace in `prepare` (so a bad file
never leaves a run directory), compute in `execute`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from cpkv.core.errors import ConfigError
from cpkv.core.kinds import RunContext
from cpkv.runs.results import RunOutput, metric
from cpkv.trace.readers import Trace, read_trace
from cpkv.trace.schema import TraceBlock, TraceCurveConfig, TraceStatsConfig
from cpkv.trace.stats import capacity_curve, trace_stats

RATIO_FIELDS = ("l1_tokens", "l2_tokens", "page_size", "l1_hit_pct", "l2_hit_pct", "cache_pct")


@dataclass(frozen=True)
class CacheRatioRow:
    """Cached prompt tokens per 100 prompt tokens at one cache setting (`-` = unlimited)."""

    setting: str
    l1_tokens: int | None
    l2_tokens: int | None
    page_size: int
    l1_hit_pct: float = metric(unit="%", lower_is_better=False)
    l2_hit_pct: float = metric(unit="%", lower_is_better=False)
    cache_pct: float = metric(unit="%", lower_is_better=False)


def load(block: TraceBlock, command: str) -> Trace:
    """The block's trace (ConfigError when no path is given)."""
    if block.path is None:
        raise ConfigError(f"trace.path: missing; give the trace file: {command} PATH")
    return read_trace(
        block.path, block.format, block.block_size, block.start, block.limit, prefix=block.prefix
    )


def _check_nonempty(trace: Trace) -> None:
    if not trace.requests:
        raise ConfigError(f"trace.start/trace.limit: no request of {trace.path} is selected")


def prepare_stats(cfg: TraceStatsConfig) -> Callable[[RunContext], RunOutput]:
    block = cfg.trace
    trace = load(block, "cpkv trace stats")
    _check_nonempty(trace)

    def execute(ctx: RunContext) -> RunOutput:
        ctx.report(0, 1, "replaying")
        stats = trace_stats(trace, block.cache)
        ctx.report(1, 1, "done")
        page = block.cache.page_size
        rows = [
            CacheRatioRow(
                "unlimited",
                None,
                None,
                page,
                stats.unlimited_cache_pct,
                0.0,
                stats.unlimited_cache_pct,
            ),
            CacheRatioRow("configured", *(getattr(stats, f) for f in RATIO_FIELDS)),
        ]
        summary = {k: v for k, v in dataclasses.asdict(stats).items() if k not in RATIO_FIELDS}
        summary.update(trace=trace.path, format=trace.format, block_size=trace.block_size)
        summary["headline"] = {
            "unlimited_cache_pct": stats.unlimited_cache_pct,
            "configured_cache_pct": rows[1].cache_pct,
        }
        directions = {"unlimited_cache_pct": "higher", "configured_cache_pct": "higher"}
        return RunOutput(
            rows=rows, summary=summary, notes=_notes(block), summary_directions=directions
        )

    return execute


def prepare_curve(cfg: TraceCurveConfig) -> Callable[[RunContext], RunOutput]:
    block, curve = cfg.trace, cfg.curve
    trace = load(block, "cpkv trace curve")
    _check_nonempty(trace)

    def execute(ctx: RunContext) -> RunOutput:
        ctx.report(0, 1, f"replaying at {len(curve.fractions)} capacities")
        points = capacity_curve(trace, curve.fractions, curve.hicache_ratio, block.cache.page_size)
        ctx.report(1, 1, "done")
        notes = [
            "capacity_pct: L1 capacity as % of the working set (tokens of all distinct blocks)"
        ]
        if curve.hicache_ratio is None:
            notes.append(
                "L2 off (curve.hicache_ratio: null): a single-tier LRU, as in Mooncake's Figure 9"
            )
        summary = {
            "trace": trace.path,
            "requests": len(trace.requests),
            "hicache_ratio": curve.hicache_ratio,
        }
        smallest = min(points, key=lambda p: p.capacity_pct)
        largest = max(points, key=lambda p: p.capacity_pct)
        summary["headline"] = {  # the two ends of the curve
            "cache_pct_at_min_capacity": smallest.cache_pct,
            "cache_pct_at_max_capacity": largest.cache_pct,
        }
        directions = dict.fromkeys(summary["headline"], "higher")
        return RunOutput(rows=points, summary=summary, notes=notes, summary_directions=directions)

    return execute


def _notes(block: TraceBlock) -> list[str]:
    l1, l2 = block.cache.capacities()
    if l1 is None:
        return ["trace.cache.l1_tokens is null: the configured row is the unlimited cache"]
    if l2 == 0:
        return ["trace.cache.l2_tokens is 0: no L2 tier"]
    return []
