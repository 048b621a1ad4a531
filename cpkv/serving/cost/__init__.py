"""Iteration-time models of the serving loop (``admit.cost``) and fitting them to measurements.

Holds: ``model`` (the cost model), ``fit`` (non-negative least squares on measured iterations:
``cpkv fit-cost``).

May import: ``cpkv.core``, ``cpkv.runs``.
"""
