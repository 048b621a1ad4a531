"""A serving run's time breakdown computed the simple way, over the whole run, as the
reference for the streamed computation of :mod:`cpkv.serving.record.iteration_log` (the
iterations expanded from the log's segments and broken down with the model's vectorised
``breakdowns``, summed into :class:`~cpkv.serving.record.timeline.TimelineSums` and
:class:`~cpkv.serving.cost.report.TimeTotals`).

:class:`CostRecorder` wraps a cost model: an engine that runs every iteration in full calls
its ``batch_us`` once per iteration (run it with
:func:`cpkv.serving.engine.simulate.simulate` and ``stretches=False``, which keeps every
sample: the wrapper offers no ``stretch``, so closed-form stretches would price their
iterations another way), and it keeps each iteration's breakdown (8 doubles) in iteration
order, the order of the engine's timeline samples; the returned time is the model's own,
float for float. Its ``breakdown`` (what the iteration log asks when it expands the samples
of the run it prices) is the model's, not recorded. :func:`bucket_breakdown` and
:func:`time_summary` then give the ``timeline.jsonl`` parts and the summary's ``time`` from
those records, by the plain loops that define them (:func:`loop_breakdown`), independent of
the run's numpy passes.
"""

from __future__ import annotations

from array import array
from typing import Any

from cpkv.serving.cost.base import IterationCost
from cpkv.serving.cost.report import FIELDS, breakdown_row, summed_time


class CostRecorder:
    """A cost model that remembers each iteration's breakdown (module docstring)."""

    __slots__ = ("model", "kv_bytes_per_token", "peak_flops_per_us", "records", "_breakdown",
                 "_extend")  # fmt: skip

    def __init__(self, model: IterationCost) -> None:
        self.model = model
        self.kv_bytes_per_token = model.kv_bytes_per_token
        self.peak_flops_per_us = model.peak_flops_per_us
        self.records = array("d")
        self._breakdown = model.breakdown
        self._extend = self.records.extend

    def breakdown(self, *arguments: int) -> tuple[float, ...]:
        """The model's breakdown of one iteration (not recorded: the log's read-back)."""
        return self._breakdown(*arguments)

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
    """Per timeline bucket: time in each part (ms), busy and MFU percentages
    (:func:`~cpkv.serving.cost.report.breakdown_row`); ``starts_us`` are the iterations'
    start times, in the recorder's order."""
    n = recorder.iterations
    if end_us <= 0 or n == 0:
        return []
    if len(starts_us) != n:
        raise ValueError(f"{len(starts_us)} timeline samples for {n} recorded iterations")
    records = recorder.records.tolist()
    rows = [records[i : i + FIELDS] for i in range(0, len(records), FIELDS)]
    sums = loop_breakdown([float(t) for t in starts_us], rows, end_us, points)
    width, peak = end_us / points, recorder.model.peak_flops_per_us
    return [breakdown_row(a, width, peak) for a in sums]


def loop_breakdown(
    starts: list[float], rows: list[list[float]], end_us: float, points: int
) -> list[list[float]]:
    """The per-bucket sums written as the plain loop they are: each iteration that stops
    inside its first bucket (or starts in the last) adds its row to that bucket, in order;
    afterwards each one that crosses an edge adds its pieces, split by time, in order."""
    width = end_us / points
    acc = [[0.0] * FIELDS for _ in range(points)]
    crossing = []
    for t, row in zip(starts, rows, strict=True):
        k = min(int(t / width), points - 1)
        stop = t + row[0]
        if k == points - 1 or stop <= (k + 1) * width:
            acc[k] = [a + v for a, v in zip(acc[k], row, strict=True)]
        else:
            crossing.append((k, t, row))
    for k, t, row in crossing:
        stop = t + row[0]
        while True:
            edge = (k + 1) * width if k < points - 1 else stop
            share = (min(stop, edge) - t) / row[0]
            acc[k] = [a + v * share for a, v in zip(acc[k], row, strict=True)]
            if stop <= edge or k == points - 1:
                break
            t, k = edge, k + 1
    return acc


def time_summary(recorder: CostRecorder, end_us: float) -> dict[str, float | None]:
    """The run's time, summed over the iterations one by one, in order (module docstring)."""
    totals = [0.0] * FIELDS
    records = recorder.records
    for i in range(0, len(records), FIELDS):
        totals = [a + v for a, v in zip(totals, records[i : i + FIELDS], strict=True)]
    return summed_time(totals, end_us, recorder.model.peak_flops_per_us)
