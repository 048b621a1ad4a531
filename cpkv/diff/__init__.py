"""``cpkv diff``: compare two runs or two sweeps from their saved results.

Holds: ``compare`` (matching rows on their identity, config differences, the verdict),
``rules`` (thresholds, spreads and the noise rule for one metric of one row pair),
``summary`` (headline and summary numbers), ``ranktest`` (Mann-Whitney U), ``serving`` (the
ranked verdict of two serving runs), ``requests`` (two serving runs request by request),
``render`` and ``render_serving`` (text, Markdown and JSON output), ``cells`` (how a value or
a change is written).

May import: ``cpkv.core``, ``cpkv.runs``.
"""
