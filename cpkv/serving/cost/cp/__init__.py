"""Context-parallel (CP) shared-KV prefill in the roofline cost model (``admit.cost.cp``).

Holds: ``spec`` (the ``admit.cost.cp`` block: the ranks, how they exchange KV, the page size,
the constants of the cached-token work), ``layout`` (how a request's extend tokens and KV
pages fall on the ranks: SGLang's zigzag split, the round-robin owner lanes of the shared
paged pool, its L1 capacity), ``work`` (the per-rank terms of one iteration, each its own
function: the split, the KV exchange, the cached-token work — materialise, index / top-k,
load-back, descriptors — and their constants' sources) and ``cost``
(:class:`~cpkv.serving.cost.cp.cost.CpRooflineCost`: the roofline model of one rank, the
terms added).

May import: the rest of ``cpkv.serving.cost``.
"""
