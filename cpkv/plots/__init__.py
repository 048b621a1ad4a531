"""Plots of result records: per-kind run plots (a registry), sweep plots, ``cpkv plot`` targets.

matplotlib is optional and imported only inside plotting functions.

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.sweep``, and the record types of capabilities
(``cpkv.trace.stats``). The runner reaches :func:`cpkv.plots.records.plot_run` through the kinds
registry.
"""
