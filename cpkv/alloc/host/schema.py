"""Config schema of ``cpkv alloc host`` (kind ``alloc_host``); keys mirror seed 003's flags."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from cpkv.alloc.rows import check_rounds
from cpkv.core.memory import MemoryNeed
from cpkv.core.schema import (
    FieldError,
    choices,
    each_positive,
    non_empty,
    non_negative,
    positive,
    require,
)
from cpkv.core.schema.limits import INT64_MAX

HOST_PATTERNS = ("contiguous_fifo", "fragmented_prefix_later_run", "random_fragmented", "no_run")
SEED_PATTERNS = HOST_PATTERNS[:3]  # seed 003's layouts; no_run is cpkv's worst case
HOST_METHODS = ("fifo", "contiguous")
HOST_OPS = ("alloc", "free", "mixed")
PROTOCOLS = ("cold", "warm")
DEFAULT_HOST_PAGES = (8192, 16384, 32768)


LAYOUT_BYTES_PER_PAGE = 100  # the free-page order as Python lists (seed 003's layouts)
BYTES_PER_SLOT = 24  # the int64 free list, the allocator's copy and a cold-protocol clone


def host_pages_from_gb(size_gb: float, *, bytes_per_token: int, page_size: int) -> int:
    """Pages of ``page_size`` tokens in ``size_gb`` GB (1e9 bytes) at ``bytes_per_token``."""
    pages = size_gb * 1e9 / float(bytes_per_token * page_size)
    if not math.isfinite(pages) or pages * page_size > INT64_MAX:
        raise FieldError(
            "host_sizes_gb",
            f"{size_gb:g} GB at {bytes_per_token} bytes/token is more token slots than an int64 "
            f"index holds; allowed: sizes whose slots stay below 2**63",
        )
    return int(math.floor(pages))


def memory_need(cfg: AllocHostConfig) -> MemoryNeed:
    """A lower bound of the memory the largest pool takes (layout lists and int64 slots)."""
    block = cfg.alloc_host
    pages = max(block.pool_pages())
    slots = pages * block.page_size
    return MemoryNeed(
        pages * LAYOUT_BYTES_PER_PAGE + slots * BYTES_PER_SLOT,
        f"alloc_host: a pool of {pages:,} pages x {block.page_size} tokens "
        f"(host_sizes_gb / host_pages, page_size)",
    )


@dataclass(frozen=True)
class AllocHostBlock:
    host_sizes_gb: tuple[float, ...] = (220.0,)
    host_pages: tuple[int, ...] = ()
    bytes_per_token: int = 100_000
    page_size: int = 64
    request_pages: tuple[int, ...] = (1, 8, 64, 512)
    patterns: tuple[str, ...] = SEED_PATTERNS
    methods: tuple[str, ...] = HOST_METHODS
    impls: tuple[str, ...] = ("reference",)
    ops: tuple[str, ...] = ("alloc",)
    protocol: Literal["cold", "warm"] = "cold"
    repeat: int = 20
    warmup: int = 5
    rounds: int = 1

    def pool_pages(self) -> list[int]:
        """Pool sizes in pages, as the seed derives them (explicit pages + sizes in GB)."""
        pages = list(self.host_pages) + [
            host_pages_from_gb(gb, bytes_per_token=self.bytes_per_token, page_size=self.page_size)
            for gb in self.host_sizes_gb
        ]
        if not pages:
            pages = list(DEFAULT_HOST_PAGES)
        return sorted({p for p in pages if p > 0})

    def validate(self) -> None:
        from cpkv.alloc.host.impls import HOST_IMPLS

        each_positive("host_sizes_gb", self.host_sizes_gb)
        each_positive("host_pages", self.host_pages)
        positive("bytes_per_token", self.bytes_per_token)
        positive("page_size", self.page_size)
        non_empty("request_pages", self.request_pages)
        each_positive("request_pages", self.request_pages)
        non_empty("patterns", self.patterns)
        choices("patterns", self.patterns, HOST_PATTERNS)
        non_empty("methods", self.methods)
        choices("methods", self.methods, HOST_METHODS)
        non_empty("impls", self.impls)
        choices("impls", self.impls, HOST_IMPLS.allowed())
        non_empty("ops", self.ops)
        choices("ops", self.ops, HOST_OPS)
        positive("repeat", self.repeat)
        non_negative("warmup", self.warmup)
        check_rounds(self.rounds, self.repeat)
        pools = self.pool_pages()
        if not pools:
            raise FieldError(
                "host_sizes_gb", "every size is below one page; allowed: sizes of at least one page"
            )
        largest = max(pools)
        require(
            largest * self.page_size <= INT64_MAX,
            "host_pages" if largest in self.host_pages else "host_sizes_gb",
            f"a pool of {largest:,} pages x {self.page_size} tokens has more token slots than "
            "an int64 index holds; allowed: pages x page_size below 2**63",
        )
        smallest = min(pools)
        for req in self.request_pages:
            require(
                req <= smallest,
                "request_pages",
                f"{req} pages is larger than the pool ({smallest} pages); allowed: 1..{smallest}",
            )
            require(
                "no_run" not in self.patterns or 2 * req <= smallest,
                "request_pages",
                f"{req} pages is more than half the pool ({smallest} pages), which pattern no_run needs; "
                f"allowed: 1..{smallest // 2}",
            )


@dataclass(frozen=True)
class AllocHostConfig:
    kind: str = "alloc_host"
    name: str = "alloc-host"
    seed: int = 0
    alloc_host: AllocHostBlock = field(default_factory=AllocHostBlock)
