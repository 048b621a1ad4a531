"""The CP shared paged L1 allocator: seed 003's algorithm and a fast one with the same answers.

Holds: ``base`` (what every implementation shares: selectors, the free-room rule, the
``L1Allocator`` frame), ``impls`` (the ``L1_IMPLS`` registry), ``reference`` (torch, seed
003's control path), ``state`` (lane state as tensors), ``fast`` (numpy) and ``fast_torch``
(CUDA, no host synchronisation) with ``owners`` (the host-side owner bookkeeping), ``layouts``
(seed 003's free and owner patterns), ``schema`` and ``bench`` (the ``alloc_l1`` kind).

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.alloc.rows``.
"""
