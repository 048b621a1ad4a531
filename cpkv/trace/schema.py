"""Config schemas of `cpkv trace stats` (kind `trace_stats`) and `cpkv trace curve`
(kind `trace_curve`). Both read the `trace` block; the curve adds a `curve` block."""

from __future__ import annotations

from dataclasses import dataclass, field

from cpkv.core.memory import MemoryNeed, file_bytes
from cpkv.core.schema import FieldError, non_empty, non_negative, positive, require
from cpkv.core.suggest import did_you_mean
from cpkv.trace.prefix_cache import DEFAULT_CACHE, CacheConfig
from cpkv.trace.prefix_model import PrefixSpec, check_prefix_format
from cpkv.trace.readers import TRACE_FORMATS
from cpkv.trace.stats import DEFAULT_FRACTIONS


@dataclass(frozen=True)
class TraceBlock:
    """`trace`: which requests to read, and the cache capacities `trace stats` reports on."""

    path: str | None = None
    format: str = "mooncake"
    block_size: int = 512
    start: int = 0
    limit: int | None = None
    cache: CacheConfig = DEFAULT_CACHE
    prefix: PrefixSpec = PrefixSpec()  # synthetic prefix sharing (azure_csv has none of its own)

    def validate(self) -> None:
        if self.format not in TRACE_FORMATS:
            allowed = ", ".join(TRACE_FORMATS.allowed())
            hint = did_you_mean(self.format, TRACE_FORMATS.allowed())
            raise FieldError(
                "format", f"unknown trace format {self.format!r}{hint} (allowed: {allowed})"
            )
        positive("block_size", self.block_size)
        non_negative("start", self.start)
        non_negative("limit", self.limit, allow_none=True)
        check_prefix_format(self.prefix, TRACE_FORMATS.canonical(self.format))


@dataclass(frozen=True)
class CurveBlock:
    """`curve`: L1 capacities as fractions of the working set; L2 = ratio x L1 (null: no L2)."""

    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    hicache_ratio: float | None = None

    def validate(self) -> None:
        non_empty("fractions", self.fractions)
        for f in self.fractions:
            non_negative("fractions", f)
        if self.hicache_ratio is not None:
            require(
                self.hicache_ratio >= 1,
                "hicache_ratio",
                f"must be null or >= 1, got {self.hicache_ratio}",
            )


@dataclass(frozen=True)
class TraceStatsConfig:
    kind: str = "trace_stats"
    name: str = "trace-stats"
    seed: int = 0
    trace: TraceBlock = field(default_factory=TraceBlock)


@dataclass(frozen=True)
class TraceCurveConfig:
    kind: str = "trace_curve"
    name: str = "trace-curve"
    seed: int = 0
    trace: TraceBlock = field(default_factory=TraceBlock)
    curve: CurveBlock = field(default_factory=CurveBlock)


BYTES_PER_TRACE_BYTE = 3  # a trace's requests (hash lists) take about that per byte of file


def memory_need(cfg: TraceStatsConfig | TraceCurveConfig) -> MemoryNeed | None:
    """A lower bound of the memory the trace's requests take (from the size of its file)."""
    block = cfg.trace
    if block.limit is not None:
        return None
    size = file_bytes(block.path)
    return MemoryNeed(size * BYTES_PER_TRACE_BYTE, f"trace.path: {block.path} ({size:,} bytes)")
