"""SGLang 0.5.23's ``PrefillAdder``, modelled decision for decision, with HiCache L2 load-back
and cpkv's CP shared-KV limits: the ``passes`` mode of ``cpkv admit``.

Holds: ``budgets`` (the knobs), ``state`` (what outlives a pass: the L1 allocator, evictable
prefixes, the queue, the continuing chunk), ``adder`` (one scheduling pass), ``ticks`` (repeated
passes on either backend: the ``BACKENDS`` registry), ``records`` (tick records and the
summary), ``token_ratio`` (SGLang's adaptive ``new_token_ratio``), ``scenarios`` (seeded random
scenarios for differential tests), ``timing`` and ``run`` (the passes-mode output),
``sglang/`` (the real SGLang backend, imported only when asked for), ``schedule_policy/``
(SGLang's waiting-queue order and priority preemption, which the serving schedulers call).

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.workload``, ``cpkv.trace``.
"""
