"""The block policies (conservative, optimistic, iteration) and cpkv's own variants of their
choices.

Holds: ``registry`` (``admit.policy``: ``POLICIES``), ``blocks`` (the KV block model, its
scans, the conservative policy), ``victims`` (whom growth preempts: ``VICTIMS``), ``growth``
(the optimistic policy), ``iteration`` (the per-iteration token budget), ``requests`` (block
requests from any workload source), ``output`` (a one-shot policy run as ``cpkv admit``
output); cpkv's own parts for the serving simulation: ``budgets`` (token weights, CUDA-graph
buckets), ``deadline`` (EDF with an aging bound), ``profiled`` (the online output quantile).

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.workload``.
"""
