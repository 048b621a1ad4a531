"""``admit.backend: sglang``: the same passes through the REAL sglang 0.5.23 objects.

Holds: ``world`` (the real ``PrefillAdder``, radix cache and allocators, built once per run on
CPU), ``backend`` (the tick loop over them). Imported only when the backend is asked for.

May import: what ``cpkv.admission`` may, and ``cpkv.admission``.
"""
