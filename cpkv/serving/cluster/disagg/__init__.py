"""A disaggregated deployment: a prefill pool and a decode pool, the KV moved between them.

Holds: ``schema`` (``admit.cluster.prefill``, ``decode``, ``link``), ``link`` (the latency +
bandwidth model of a prefill instance's sends), ``driver`` (both pools driven in time order,
the handoff from a prefill instance to a decode instance), ``tallies`` (what each side's
router sees, the per-request handoff times), ``serve`` (the run's outputs: per pool, the
link, the TTFT split).

May import what :mod:`cpkv.serving.cluster` may, and :mod:`cpkv.serving.cluster` itself.
"""
