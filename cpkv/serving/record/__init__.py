"""What a serving run reports: ``requests`` (each ended request's record, the latency
statistics) and ``lines`` (their ``requests.jsonl`` lines), ``iteration_log`` (the
iterations as segments) and ``segments`` (their format, expanded and summed once the run
has ended), ``token_gaps`` (the gaps between a
request's consecutive tokens, as weighted records), ``itl`` (the inter-token latency, exact
order statistics of those gaps), ``timeline`` (its ``timeline.jsonl`` buckets), ``metrics``
(the summary row), ``policy_metrics`` (the admission-policy columns and summary),
``trace`` (``trace.json``, streamed, and the room it needs on the disk),
``memory`` (what the outputs hold, for the memory check before a run).

May import: ``cpkv.core``, ``cpkv.runs``, and ``cpkv.serving``'s ``model`` and ``cost``.
"""
