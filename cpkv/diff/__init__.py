"""``cpkv diff``: compare two runs or two sweeps from their saved results.

Holds: ``compare`` (matching rows on their identity, config differences, the verdict),
``rules`` (thresholds, spreads and the noise rule for one metric of one row pair), ``render``
(text, Markdown and JSON output).

May import: ``cpkv.core``, ``cpkv.runs``.
"""
