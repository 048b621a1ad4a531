"""KV allocators and their benchmarks: the host (L2) allocator and the CP shared paged L1.

Holds: ``rows`` (the row fields both benchmarks share), ``host/`` (``cpkv alloc host``),
``l1/`` (``cpkv alloc l1``).

May import: ``cpkv.core``, ``cpkv.runs``; torch and numpy lazily.
"""
