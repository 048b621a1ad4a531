"""The fast host (L2) KV allocator (impl ``fast``) and its parts: ``allocator``
(:class:`FastHostAllocator`), ``queue`` (the incremental page index), ``firstfit`` (the
first-fit search over the free-page bitmap), ``pages`` (page arithmetic and checks) and
``handouts`` (what a handed-out selection lets ``free`` skip reading)."""

from cpkv.alloc.host.fast.allocator import FastHostAllocator

__all__ = ["FastHostAllocator"]
