"""Config schema of ``cpkv alloc l1`` (kind ``alloc_l1``); keys mirror seed 003's ``--bench l1``
flags (``--physical-pages``, ``--cp-size``, ``--l1-impl``, ``--l1-ops``, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cpkv.alloc.l1.layouts import FREE_PATTERNS, OWNER_PATTERNS
from cpkv.alloc.rows import check_rounds
from cpkv.core.memory import MemoryNeed
from cpkv.core.schema import choices, each_positive, non_empty, non_negative, positive, require
from cpkv.core.schema.limits import INT64_MAX

L1_OPS = ("stats", "free_room_stats", "select_only", "alloc_pages", "free")
BYTES_PER_PAGE = 100  # lanes as Python lists (free + release) or numpy arrays, and the layout
TOKEN_INDEX_BYTES = 4 * 8
"""An allocation's token indices (``page * page_size + offset``, int64): the pages repeated,
the offsets tiled, their sum and the cached template of a contiguous run, 8 bytes each."""


def memory_need(cfg: AllocL1Config) -> MemoryNeed:
    """A lower bound of the memory the largest pool's lanes and layout take, and the token
    indices of the largest request (``request_pages x page_size`` of them)."""
    block = cfg.alloc_l1
    pages = max(block.physical_pages) * block.cp_size
    tokens = max(block.request_pages) * block.page_size
    return MemoryNeed(
        pages * BYTES_PER_PAGE + tokens * TOKEN_INDEX_BYTES,
        f"alloc_l1: {max(block.physical_pages):,} physical pages x cp_size {block.cp_size} "
        f"and a request of {max(block.request_pages):,} pages x page_size {block.page_size:,} "
        "tokens (physical_pages, cp_size, request_pages, page_size)",
    )


@dataclass(frozen=True)
class AllocL1Block:
    physical_pages: tuple[int, ...] = (8192, 32768)
    cp_size: int = 8
    page_size: int = 64
    request_pages: tuple[int, ...] = (8, 64, 512)
    free_patterns: tuple[str, ...] = FREE_PATTERNS
    owner_patterns: tuple[str, ...] = OWNER_PATTERNS
    impls: tuple[str, ...] = ("fifo", "contiguous")
    ops: tuple[str, ...] = ("alloc_pages",)
    free_room_ratio: float = 0.15
    free_room_trigger_ratio: float = 0.05
    lane_order: Literal["sorted", "as_given"] = "sorted"
    device: str = "cpu"
    protocol: Literal["cold", "warm"] = "cold"
    repeat: int = 20
    warmup: int = 5
    rounds: int = 1

    def validate(self) -> None:
        from cpkv.alloc.l1.impls import L1_IMPLS

        non_empty("physical_pages", self.physical_pages)
        each_positive("physical_pages", self.physical_pages)
        positive("cp_size", self.cp_size)
        positive("page_size", self.page_size)
        non_empty("request_pages", self.request_pages)
        each_positive("request_pages", self.request_pages)
        non_empty("free_patterns", self.free_patterns)
        choices("free_patterns", self.free_patterns, FREE_PATTERNS)
        non_empty("owner_patterns", self.owner_patterns)
        choices("owner_patterns", self.owner_patterns, OWNER_PATTERNS)
        non_empty("impls", self.impls)
        choices("impls", self.impls, L1_IMPLS.allowed())
        non_empty("ops", self.ops)
        choices("ops", self.ops, L1_OPS)
        non_negative("free_room_ratio", self.free_room_ratio)
        non_negative("free_room_trigger_ratio", self.free_room_trigger_ratio)
        positive("repeat", self.repeat)
        non_negative("warmup", self.warmup)
        check_rounds(self.rounds, self.repeat)
        largest = (max(self.physical_pages) * self.cp_size + 1) * self.page_size
        require(
            largest <= INT64_MAX,
            "page_size",
            f"token indices reach (physical_pages {max(self.physical_pages):,} x cp_size "
            f"{self.cp_size} + 1) x page_size {self.page_size:,} = {largest:.3g}, beyond int64; "
            "allowed: that product below 2**63",
        )
        pool = min(self.physical_pages) * self.cp_size
        for req in self.request_pages:
            require(
                req <= pool,
                "request_pages",
                f"{req} pages is larger than the pool ({min(self.physical_pages)} physical pages"
                f" x cp_size {self.cp_size} = {pool} pages); allowed: 1..{pool}",
            )


@dataclass(frozen=True)
class AllocL1Config:
    kind: str = "alloc_l1"
    name: str = "alloc-l1"
    seed: int = 0
    alloc_l1: AllocL1Block = field(default_factory=AllocL1Block)
