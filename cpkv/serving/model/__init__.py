"""What a serving instance holds: its requests (``request``: :class:`Req` and its states),
its KV pool (``kv_pool``: blocks, the running set, growth and preemption) and its
requests' prefix hits (``hits``: fixed, or from the live tiered prefix cache).

May import: ``cpkv.core``, ``cpkv.workload``, ``cpkv.trace``, ``cpkv.policies``.
"""
