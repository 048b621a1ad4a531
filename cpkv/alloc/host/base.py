"""The interface every host (L2) allocator implementation offers (``alloc_host.impls``).

An implementation is built as ``factory(page_size, free_slots)`` from a 1-D int64 torch tensor
of token slots (the free list, in order) and registered in :data:`cpkv.alloc.host.impls.HOST_IMPLS`.
Selections are 1-D int64 tensors of token slots, or ``None`` when the free list is too short.
The reference (:class:`cpkv.alloc.host.reference.HostAllocator`) defines the answers; every
other implementation must give the same selections in the same order.
"""

from __future__ import annotations

from typing import Any, Protocol


class HostAllocatorImpl(Protocol):
    """What the benchmark and the differential tests call on a host allocator."""

    def alloc(self, need_size: int) -> Any:
        """FIFO: the first ``need_size`` free slots (``None`` if fewer are free)."""

    def alloc_contiguous_preferred(self, need_size: int) -> Any:
        """The FIFO prefix if it is contiguous, else the lowest-addressed run of whole,
        physically consecutive pages, else FIFO (seed 003's rule)."""

    def free(self, slots: Any) -> int:
        """Append ``slots`` to the free list; returns how many were freed."""

    def available_size(self) -> int:
        """Free token slots."""

    def free_slot_list(self) -> list[int]:
        """The logical free list, in order (for differential tests)."""
