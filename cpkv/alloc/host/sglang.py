"""``impls: sglang``: SGLang's real ``HostKVCache`` allocation path (the seed's ``production``).

Only the allocator's index bookkeeping is built (no host KV buffer): the real class's
``alloc``/``free`` run on a free list laid out by cpkv. SGLang 0.5.23's ``HostKVCache``
has FIFO ``alloc`` and a ``free`` that defers merging (a release list); it has no
contiguous-preferred method, so ``method: contiguous`` is skipped for this impl.
"""

from __future__ import annotations

import threading
from typing import Any

from cpkv.core.sglang_env import import_sglang_module, require_sglang

_CLASS: list[type] = []


def _host_class() -> type:
    if not _CLASS:
        base = import_sglang_module("sglang.srt.mem_cache.pool_host.base").HostKVCache
        abstract = {name: (lambda self, *a, **k: None) for name in base.__abstractmethods__}
        _CLASS.append(type("CpkvIndexOnlyHostKVCache", (base,), abstract))
    return _CLASS[0]


class SglangHostAllocator:
    """Adapter exposing cpkv's host allocator interface over a real HostKVCache."""

    name = "sglang"

    def __init__(self, page_size: int, free_slots: Any) -> None:
        import torch

        cache = _host_class().__new__(_host_class())
        size = int(free_slots.max()) + 1 if free_slots.numel() else 0
        cache.page_size = int(page_size)
        cache.dcp_size, cache.dcp_rank = 1, 0
        cache.lock = threading.RLock()
        cache.free_slots = free_slots
        cache.release_slots, cache.num_release_slots = [], 0
        cache.slot_used = torch.zeros(size, dtype=torch.bool)
        self.cache = cache
        self.page_size = int(page_size)

    def available_size(self) -> int:
        return int(self.cache.available_size())

    def alloc(self, need_size: int) -> Any:
        return self.cache.alloc(need_size)

    def free(self, slots: Any) -> int:
        return int(self.cache.free(slots))

    def free_slot_list(self) -> list[int]:
        c = self.cache
        return c.free_slots.tolist() + [s for chunk in c.release_slots for s in chunk.tolist()]


def make_sglang_host_allocator(page_size: int, free_slots: Any) -> SglangHostAllocator:
    return SglangHostAllocator(page_size, free_slots)


make_sglang_host_allocator.methods = ("fifo",)  # type: ignore[attr-defined]
make_sglang_host_allocator.check_available = lambda: require_sglang("alloc_host impl `sglang`")  # type: ignore[attr-defined]
