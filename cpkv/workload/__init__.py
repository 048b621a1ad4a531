"""Waiting requests and where they come from.

Holds: ``request`` (the prefill request of seed 000 — L1 hit, L2 hit, extend tokens — and
running decodes, page rounding), ``sources`` (the ``admit.workload`` registry: ``grid``,
``jsonl``, ``trace``, ``synthetic``), ``synthetic`` (seeded distributions), ``trace`` (a request
trace replayed through the L1/L2 prefix cache becomes a queue), ``jsonl_writer``
(``--write-workload``).

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.trace``.
"""
