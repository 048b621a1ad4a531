"""``cpkv diff``: compare two runs or two sweeps from their saved results, or two runs measured again.

Holds: ``compare`` (matching rows on their identity, the verdict), ``match`` (config
differences, rows keyed by identity), ``rules`` (thresholds and the timing factor, spreads
and the noise rule for one metric of one row pair), ``summary`` (headline and summary
numbers), ``ranktest`` (Mann-Whitney U), ``rerun`` (``--rerun``: both configs run again,
interleaved), ``rounds`` (a rerun's rows judged in pairs), ``paired`` (the paired t-test),
``serving`` (the ranked verdict of two serving runs), ``requests`` (two serving runs request
by request), ``render`` and ``render_serving`` (text, Markdown and JSON output), ``cells``
(how a value or a change is written).

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.sweep`` (listing).
"""
