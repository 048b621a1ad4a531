"""Registry of host allocator implementations (``alloc_host.impls``).

An implementation is built as ``factory(page_size, free_slots)`` from an int64 torch
tensor of token slots, and offers ``alloc(n)``, ``alloc_contiguous_preferred(n)``,
``free(slots)``, ``available_size()`` and ``free_slot_list()`` (the logical free list,
for differential tests). Selections are 1-D int64 tensors of token slots, or None.
"""

from __future__ import annotations

from cpkv.core.registry import Registry

HOST_IMPLS: Registry = Registry("host allocator impl")
HOST_IMPLS.register(
    "reference",
    "cpkv.alloc.host.reference:HostAllocator",
    help="seed 003's algorithm (torch): rescans the free list",
)
HOST_IMPLS.register(
    "fast",
    "cpkv.alloc.host.fast:FastHostAllocator",
    help="the reference's answers from an incremental page index (numpy)",
)
HOST_IMPLS.register(
    "sglang",
    "cpkv.alloc.host.sglang:make_sglang_host_allocator",
    help="SGLang's real HostKVCache (needs the sglang extra; FIFO alloc and free only)",
    aliases=("production",),
)
