"""The host (L2 / HiCache) KV allocator: seed 003's algorithm and a fast one with the same answers.

Holds: ``base`` (the interface every implementation offers), ``impls`` (the ``HOST_IMPLS``
registry: ``reference``, ``fast``, ``sglang``), ``reference`` (seed 003's algorithm, torch),
``fast`` (an incremental page index, numpy) with its parts ``pages``, ``queue``, ``firstfit``
and ``handouts``, ``sglang`` (SGLang's real ``HostKVCache``), ``layouts`` (seed 003's free-list
layouts), ``mixed`` (the alloc/free workload), ``schema`` and ``bench`` (the ``alloc_host``
kind).

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.alloc.rows``.
"""
