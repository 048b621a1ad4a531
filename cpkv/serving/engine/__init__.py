"""The serving engine: ``engine`` (:class:`Engine`: one instance's iterations, from arrival
to recorded event), ``stretch`` (the iterations between events in closed form),
``lifecycle`` (timeouts, cancellations, swap: what happens to requests outside a plan),
``invariants`` (the block model's common errors, checked), ``settings`` (what an engine
reads, from the ``admit`` block), ``simulate`` (a whole run kept in memory).

May import: ``cpkv.core``, ``cpkv.workload``, ``cpkv.trace``, ``cpkv.admission``,
``cpkv.policies``, and ``cpkv.serving``'s ``model``, ``schedulers``, ``cost``, ``record``,
``input``.
"""
