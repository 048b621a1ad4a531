"""cpkv's multi-dimensional iteration budgets: prefill, decode and verification tokens do
not cost the same.

* :class:`TokenWeights` (``admit.iteration.weights``): what one prefill, decode and
  speculative-verification token costs of the iteration's ``budget_tokens``. An iteration
  of ``d`` decoding requests, each verifying ``v`` draft tokens (``admit.iteration.
  verify_tokens``), leaves :func:`weighted_prefill_budget` prefill tokens:
  ``floor((budget - w_decode * d - w_verify * v * d) / w_prefill)`` (never below 0);
  :func:`weighted_work` is the work an iteration spent, which never exceeds the budget
  when it carried any prefill (the invariant the serving engine checks);
* :func:`graph_bucket`: a decode-only batch of ``n`` requests runs the CUDA graph of the
  smallest captured bucket ``>= n`` (``admit.serving.cuda_graph_buckets``); the bucket's
  ``bucket - n`` padding requests cost decode time and are reported. A batch larger than
  every bucket runs without a graph (no padding), as SGLang's ``cuda_graph_max_bs`` does.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from cpkv.core.schema import Range

MAX_WEIGHT = 1000.0
WEIGHT_WHY = "a token costs at most 1000 budget units; beyond, no token fits any budget"
PrefillWeight = Annotated[
    float,
    Range(
        1e-3, MAX_WEIGHT, why=WEIGHT_WHY,
        low_why="a prefill token costs at least 1/1000 of a unit; below, a budget admits "
        "millions of prefill tokens per unit",
    ),
]  # fmt: skip
Weight = Annotated[float, Range(0, MAX_WEIGHT, why=WEIGHT_WHY)]


@dataclass(frozen=True)
class TokenWeights:
    """``admit.iteration.weights``: budget units per prefill, decode and verify token."""

    prefill: PrefillWeight = 1.0
    decode: Weight = 1.0
    verify: Weight = 1.0

    @property
    def is_default(self) -> bool:
        return self == TokenWeights()


def weighted_prefill_budget(
    budget_tokens: int, decoded: int, verify_tokens: int, weights: TokenWeights
) -> int:
    """Prefill tokens the iteration may still carry after ``decoded`` decode tokens (each
    with ``verify_tokens`` verification tokens), in whole tokens, at least 0."""
    left = budget_tokens - weights.decode * decoded - weights.verify * verify_tokens * decoded
    if left <= 0:
        return 0
    return int(math.floor(left / weights.prefill + 1e-9))


def weighted_work(
    prefill_tokens: int, decoded: int, verify_tokens: int, weights: TokenWeights
) -> float:
    """The budget units an iteration spent."""
    return (
        weights.prefill * prefill_tokens
        + weights.decode * decoded
        + weights.verify * verify_tokens * decoded
    )


def graph_bucket(requests: int, buckets: Sequence[int]) -> int:
    """The batch size a decode-only batch of ``requests`` runs at (``buckets`` sorted
    ascending): the smallest bucket ``>= requests``, or ``requests`` itself when none is
    (or when there are no buckets)."""
    k = bisect.bisect_left(buckets, requests)
    return buckets[k] if k < len(buckets) else requests
