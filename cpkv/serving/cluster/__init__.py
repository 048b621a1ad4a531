"""Many serving instances behind a router (``admit.cluster``).

Holds: ``schema`` (the ``admit.cluster`` block), ``routers`` (the router registry, the
snapshot a router decides from and its decisions), ``prefix_tree`` (the approximate prefix
tree of the ``prefix_aware`` router). The driver that runs several instances of the serving
loop and fills the routers' snapshots is not here yet: a serving run with
``admit.cluster.instances > 1`` is refused when its config is checked.

May import what :mod:`cpkv.serving` may.
"""
