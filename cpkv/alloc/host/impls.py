"""Registry of host allocator implementations (``alloc_host.impls``).

Each entry is a factory ``(page_size, free_slots) -> HostAllocatorImpl``
(:class:`cpkv.alloc.host.base.HostAllocatorImpl`), imported lazily when used.
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
