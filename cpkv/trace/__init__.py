"""Request traces and the tiered L1/L2 prefix cache they are replayed through.

Holds: ``readers`` (one reader per trace format, a registry), ``prefix_cache`` (the HiCache
model: L1 and L2 tiers, LRU, write-through, replay), ``stats`` (lengths, arrivals, cache
ratios, the hit ratio against capacity), ``prefix_model`` (synthetic prefix sharing for
traces without prefix information), ``schema`` and ``run`` (the ``trace_stats`` and
``trace_curve`` kinds).

May import: ``cpkv.core``, ``cpkv.runs``.
"""
