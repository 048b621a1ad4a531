"""``admit.mode: serving``: time, arrivals, decode and KV growth around a scheduler.

Holds, each part importing only those before it: ``model`` (requests, the KV pool, prefix
hits), ``schedulers`` (the scheduler seam and the schedulers: SGLang's PrefillAdder, the
block policies, the admission-policy options), ``cost`` (iteration times: the roofline and
linear models, stretches in closed form, calibration), ``record`` (requests.jsonl, the
iteration log, the timeline, the summary row, trace.json), ``input`` (workloads and
arrivals), ``engine`` (the engine: one instance's iterations, closed-form stretches, the
request lifecycle), ``cluster`` (instances behind a router, ``admit.cluster``); ``schema``
(the ``admit.arrivals``, ``admit.slo`` and ``admit.serving`` blocks) and ``run`` (the
serving run's output). docs/ARCHITECTURE.md draws one iteration's path.

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.workload``, ``cpkv.trace``,
``cpkv.admission``, ``cpkv.policies``.
"""
