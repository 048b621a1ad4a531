"""The ``admit`` kind: one config block that drives three capabilities.

Holds: ``schema`` (``AdmitConfig``: the ``admit:`` block composed of the admission budgets, the
workload, the block policies' ``kv`` and ``iteration`` blocks and the serving blocks) and
``run`` (its prepare: ``mode: passes`` with policy ``prefill_adder`` -> :mod:`cpkv.admission`,
another policy -> :mod:`cpkv.policies`, ``mode: serving`` -> :mod:`cpkv.serving`).

May import: every capability (``cpkv.admission``, ``cpkv.policies``, ``cpkv.serving``,
``cpkv.workload``, ``cpkv.trace``) and below.
"""
