"""What runs next: the scheduler seam (``base``: the :class:`Scheduler` interface and the
``SCHEDULERS`` registry by ``admit.policy``; ``plan``: the typed :class:`Plan` of an
iteration and :class:`Quiet`, the iterations whose plans are known) and the schedulers:
``prefill_adder`` (SGLang's PrefillAdder, its pass in ``adder_pass``), ``blocks``
(``conservative``, ``optimistic`` and what the block policies share), ``iteration``,
``profiled``; the parts they compose: ``budget`` (the per-iteration token budget),
``options`` (the admission-policy options: queue orders, priority preemption).

May import: ``cpkv.core``, ``cpkv.workload``, ``cpkv.admission``, ``cpkv.policies``, and
``cpkv.serving.model``.
"""
