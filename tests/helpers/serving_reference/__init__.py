"""The serving loop as it was before issue 18 (commit 2ff6807), kept as an independent
reference model: the optimised loop (:mod:`cpkv.serving`) must give the same results, byte for
byte, as this one (``tests/serving/test_reference.py``).

Frozen copies of ``cpkv/serving/{loop,decode_stretch,kv_pool,adder,block_policies,hits,metrics}.py``
at that commit, their imports pointed at each other; :func:`run_reference` is their whole run
(simulate, then the summary row, ``requests.jsonl`` and ``timeline.jsonl``). Do not edit them
to follow the optimised code: they are the definition it is checked against.
"""

from __future__ import annotations

import json
from typing import Any

from tests.helpers.serving_reference.loop import simulate
from tests.helpers.serving_reference.metrics import request_lines, summary_row, timeline


def run_reference(requests: Any, settings: Any, cache: Any, slo: Any, points: int) -> tuple:
    """``(row, requests.jsonl text, timeline.jsonl text, SimResult)`` of the old loop."""
    res = simulate(requests, settings, cache)
    cap = settings.capacity_blocks
    row = summary_row(res, slo, cap)
    lines = request_lines(res)
    tl = "".join(json.dumps(p, separators=(",", ":")) + "\n" for p in timeline(res, cap, points))
    return row, lines, tl, res
