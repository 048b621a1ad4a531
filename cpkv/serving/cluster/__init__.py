"""Many serving instances behind a router (``admit.cluster``).

Holds: ``schema`` (the ``admit.cluster`` block), ``routers`` (the router registry, the
snapshot a router decides from and its decisions), ``prefix_tree`` (the approximate prefix
tree of the ``prefix_aware`` router), ``driver`` (instances of the serving engine fed by a
router at each arrival, the loads it sees, a shared L2), ``serve`` (a cluster run's outputs:
per instance and in total).

May import what :mod:`cpkv.serving` may, and :mod:`cpkv.serving` itself.
"""
