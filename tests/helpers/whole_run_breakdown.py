"""A serving run's time breakdown computed the simple way, over the whole run, as the
reference for the streamed computation of :mod:`cpkv.serving.cost.report`.

:class:`CostRecorder` wraps a cost model: the loop calls its ``batch_us`` once per
iteration (run it with :func:`cpkv.serving.loop.simulate`, which keeps every sample, or with
the frozen reference loop), and it keeps each iteration's breakdown (8 doubles) in iteration
order, the order of the loop's timeline samples; the returned time is the model's own, float
for float. :func:`bucket_breakdown` and :func:`time_summary` then give the ``timeline.jsonl``
parts and the summary's ``time`` from those records.
"""

from __future__ import annotations

from array import array
from typing import Any

from cpkv.serving.cost.base import IterationCost
from cpkv.serving.cost.report import FIELDS, BreakdownBuckets, summed_time


class CostRecorder:
    """A cost model that remembers each iteration's breakdown (module docstring)."""

    __slots__ = ("model", "kv_bytes_per_token", "records", "_breakdown", "_extend")

    def __init__(self, model: IterationCost) -> None:
        self.model = model
        self.kv_bytes_per_token = model.kv_bytes_per_token
        self.records = array("d")
        self._breakdown = model.breakdown
        self._extend = self.records.extend

    def batch_us(
        self,
        prefill_tokens: int,
        decode_requests: int,
        decode_context_tokens: int,
        prefill_context_tokens: int,
        prefill_attention_pairs: int,
        loaded_tokens: int,
    ) -> float:
        parts = self._breakdown(
            prefill_tokens,
            decode_requests,
            decode_context_tokens,
            prefill_context_tokens,
            prefill_attention_pairs,
            loaded_tokens,
        )
        self._extend(parts)
        return parts[0]

    @property
    def iterations(self) -> int:
        return len(self.records) // FIELDS


def bucket_breakdown(
    starts_us: Any, recorder: CostRecorder, end_us: float, points: int
) -> list[dict[str, float | None]]:
    """Per timeline bucket: time in each part (ms), busy and MFU percentages (see the module
    docstring); ``starts_us`` are the iterations' start times, in the recorder's order."""
    import numpy as np

    n = recorder.iterations
    if end_us <= 0 or n == 0:
        return []
    if len(starts_us) != n:
        raise ValueError(f"{len(starts_us)} timeline samples for {n} recorded iterations")
    buckets = BreakdownBuckets(end_us, points, recorder.model.peak_flops_per_us)
    buckets.add(starts_us, np.frombuffer(recorder.records, dtype=float).reshape(n, FIELDS))
    return buckets.rows()


def time_summary(recorder: CostRecorder, end_us: float) -> dict[str, float | None]:
    """The run's time, summed: busy, each part, model FLOPs and MFU (module docstring)."""
    import numpy as np

    n = recorder.iterations
    totals = (
        np.frombuffer(recorder.records, dtype=float).reshape(n, FIELDS).sum(axis=0)
        if n
        else np.zeros(FIELDS)
    )
    return summed_time(totals, end_us, recorder.model.peak_flops_per_us)
