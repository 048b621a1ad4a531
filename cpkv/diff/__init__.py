"""``cpkv diff``: compare two runs or two sweeps from their saved results, or two runs measured again.

Holds: ``compare`` (matching rows on their identity, the verdict), ``match`` (config
differences, rows keyed by identity), ``rules`` (thresholds and the timing factor, spreads
and the noise rule for one metric of one row pair), ``summary`` (headline and summary
numbers), ``ranktest`` (Mann-Whitney U), ``render`` (text, Markdown and JSON output),
``cells`` (how a value or a change is written); ``serving/`` (two serving runs: the ranked
verdict, request by request, their output) and ``rerun/`` (``--rerun``: both configs run
again interleaved, the rounds judged in pairs).

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.sweep`` (listing).
"""
