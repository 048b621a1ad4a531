"""``admit.mode: serving``: time, arrivals, decode and KV growth around an admission policy.

Holds: ``loop`` (the iteration loop), ``kv_pool`` (blocks, the running set, growth and
preemption), ``adder`` (one PrefillAdder pass inside the loop), ``block_policies`` (seed 004's
policies as continuous policies), ``decode_stretch`` (decode-only stretches in one step),
``hits`` (prefix hits, fixed or from the live prefix cache), ``workload`` (requests and their
arrival times), ``metrics`` (the summary row, ``requests.jsonl``, ``timeline.jsonl``),
``schema`` (arrivals, SLOs, loop options), ``run`` (the serving run's output); issue 13's
admission-policy space: ``policy_options`` (the non-default policy keys), ``lifecycle`` (queue
orders, priority preemption, profiled, budgets, margin, swap, timeouts, cancellation),
``graph_padding`` (CUDA-graph decode buckets), ``invariants`` (seed 004's common errors,
checked), ``policy_metrics`` (the policy columns and summary); ``cost/`` (the
iteration-time models — roofline and linear —, their calibration and the time breakdown);
``trace_events`` (``trace.json``, the run in the Chrome trace-event format); ``cluster/``
(instances behind a router, ``admit.cluster``).

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.workload``, ``cpkv.trace``,
``cpkv.admission``, ``cpkv.policies``.
"""
