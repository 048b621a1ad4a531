"""Registry of L1 allocator implementations (``alloc_l1.impls``).

A name picks an implementation (``reference``: torch, the seed's control path; ``fast``:
numpy on CPU, torch without host synchronisation on CUDA) and a selector (``fifo`` or
``contiguous``; the seed calls the contiguous selector ``current``).  The bench reports them
as the row fields ``impl`` and ``method``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpkv.core.registry import Registry


@dataclass(frozen=True)
class L1Impl:
    """An implementation (``reference`` | ``fast``) with a selector (``fifo`` | ``contiguous``)."""

    impl: str
    method: str


L1_IMPLS: Registry[L1Impl] = Registry("L1 allocator impl")
L1_IMPLS.register(
    "fifo", L1Impl("reference", "fifo"), help="reference allocator (torch), FIFO selection"
)
L1_IMPLS.register(
    "contiguous",
    L1Impl("reference", "contiguous"),
    help="reference allocator (torch), contiguous-preferred selection",
    aliases=("current",),
)
L1_IMPLS.register(
    "fast_fifo", L1Impl("fast", "fifo"), help="fast allocator (numpy / CUDA torch), FIFO selection"
)
L1_IMPLS.register(
    "fast_contiguous",
    L1Impl("fast", "contiguous"),
    help="fast allocator (numpy / CUDA torch), contiguous-preferred selection",
    aliases=("fast_current",),
)
