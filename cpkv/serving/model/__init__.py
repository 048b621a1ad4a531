"""What a serving instance holds: its requests (``request``: :class:`Req` and its states),
its KV pool (``kv_pool``: blocks, the running set, growth and preemption), its
requests' prefix hits (``hits``: fixed, or from the live tiered prefix cache), the
prefilling requests of a token budget (``prefill_lane``), the coming decode steps as a
scheduler sees them (``decode_ahead``) and, in cpkv's loop, their runs of consecutive
tokens (``token_runs``, for the token gaps).

May import: ``cpkv.core``, ``cpkv.workload``, ``cpkv.trace``, ``cpkv.policies``.
"""
