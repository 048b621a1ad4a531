"""CUDA-graph decode buckets (``admit.serving.cuda_graph_buckets``): :class:`PaddedDecodeCost`,
a wrapper around any cost model that prices a decode-only batch at its graph's batch size.

An engine replays captured CUDA graphs for decode-only batches: a batch of ``D`` requests
runs the graph of the smallest captured batch size at least ``D``
(:func:`~cpkv.policies.budgets.graph_bucket`; ``D`` itself when none is), so the
``bucket - D`` padding requests cost decode time (they read no context: the decode context
is the real requests'). A batch with prefill tokens or load-back runs eagerly, unpadded.
The wrapper counts the padding requests and the time they cost (``padding_requests``,
``padding_us``) over every padded iteration it priced by :meth:`~PaddedDecodeCost.batch_us`
or was told of by :meth:`~PaddedDecodeCost.stretch_ran`.
"""

from __future__ import annotations

from typing import Any

from cpkv.policies.budgets import graph_bucket
from cpkv.serving.cost.stretch import AffinePieces, Looped


class PaddedDecodeCost:
    """A cost model whose decode-only batches run at their CUDA-graph bucket size (the
    module docstring); everything else is the inner model's."""

    def __init__(self, inner: Any, buckets: tuple[int, ...]) -> None:
        self.inner, self.buckets = inner, buckets
        self.padding_requests = 0  # padding requests over every padded batch
        self.padding_us = 0.0  # the decode time they cost

    def batch_us(self, prefill, decode, decode_context, prefill_context, pairs, loaded) -> float:
        """The iteration's time; a padded one adds its padding to the counters."""
        inner = self.inner
        if prefill or loaded or not decode:
            return inner.batch_us(prefill, decode, decode_context, prefill_context, pairs, loaded)
        size = graph_bucket(decode, self.buckets)
        padded = inner.batch_us(0, size, decode_context, 0, 0, 0)
        if size > decode:
            self.padding_requests += size - decode
            self.padding_us += padded - inner.batch_us(0, decode, decode_context, 0, 0, 0)
        return padded

    def stretch(
        self, prefill, decode, decode_context, prefill_context, pairs, prefill_context_step,
        pairs_step,
    ) -> AffinePieces | Looped:  # fmt: skip
        """The durations of a stretch (:mod:`cpkv.serving.cost.stretch`): a decode-only one
        (``prefill == 0``; a stretch loads nothing) at the bucket size, the padding reading
        no context (``decode_context_step`` is the real requests'), any other as the inner
        model's. Counts nothing: the engine reports the iterations it ran of it by
        :meth:`stretch_ran`. An inner model without ``stretch`` is looped over (uncounted)."""
        if prefill or not decode:
            return self._inner_stretch(
                prefill, decode, decode_context, prefill_context, pairs, prefill_context_step,
                pairs_step, decode,
            )  # fmt: skip
        size = graph_bucket(decode, self.buckets)
        return self._inner_stretch(0, size, decode_context, 0, 0, 0, 0, decode)

    def stretch_ran(
        self, prefill: int, decode: int, decode_context: int, steps: int, durations: Any = None
    ) -> None:
        """Count the padding of the first ``steps`` iterations of the stretch
        ``stretch(prefill, decode, decode_context, ...)`` (its first iteration's arguments),
        which the engine ran: what ``steps`` calls of :meth:`batch_us` on those iterations
        would have added, within rounding. ``durations``: what :meth:`stretch` returned for
        it (None: computed again). Nothing for a stretch with prefill tokens (unpadded) or
        a batch already at its bucket size. The padding time is the padded durations minus
        the unpadded ones, summed piece by piece from their coefficients' differences (no
        cancellation between the two sums)."""
        if prefill or not decode or steps <= 0:
            return
        size = graph_bucket(decode, self.buckets)
        if size <= decode:
            return
        if durations is None:
            durations = self.stretch(0, decode, decode_context, 0, 0, 0, 0)
        bare = self._inner_stretch(0, decode, decode_context, 0, 0, 0, 0, decode)
        self.padding_requests += (size - decode) * steps
        self.padding_us += _difference_total(durations, bare, steps)

    def _inner_stretch(self, prefill, decode, dc, pc, pairs, pc_step, pairs_step, dc_step):
        inner = self.inner
        if getattr(type(inner), "stretch", None) is not None:
            return inner.stretch(
                prefill, decode, dc, pc, pairs, pc_step, pairs_step, decode_context_step=dc_step
            )
        return Looped(inner, (prefill, decode, dc, pc, pairs, pc_step, pairs_step), dc_step)

    def _padded(self, prefill, decode, loaded):  # numpy arrays: the decode-only rows padded
        import numpy as np

        buckets = np.asarray(self.buckets)
        k = np.searchsorted(buckets, decode)  # bisect_left, as graph_bucket
        bucket = np.where(k < len(buckets), buckets[np.minimum(k, len(buckets) - 1)], decode)
        pad = (prefill == 0) & (loaded == 0) & (decode > 0)
        return np.where(pad, bucket, decode)

    def breakdowns(self, prefill, decode, decode_context, prefill_context, pairs, loaded):
        """The inner model's breakdown columns at the padded batch sizes."""
        from cpkv.serving.cost.report import breakdown_columns

        padded = self._padded(prefill, decode, loaded)
        return breakdown_columns(
            self.inner, prefill, padded, decode_context, prefill_context, pairs, loaded
        )

    def breakdown(self, prefill, decode, decode_context, prefill_context, pairs, loaded):
        """The inner model's breakdown at the padded batch size (nothing counted)."""
        if not (prefill or loaded or not decode):
            decode = graph_bucket(decode, self.buckets)
        return self.inner.breakdown(prefill, decode, decode_context, prefill_context, pairs, loaded)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _difference_total(padded: Any, bare: Any, steps: int) -> float:
    """``sum(padded.duration(j) - bare.duration(j) for j < steps)``: from the pieces'
    coefficient differences when both are affine with the same pieces, else iteration by
    iteration, in order (as ``steps`` calls of ``batch_us`` add it)."""
    if (
        isinstance(padded, AffinePieces)
        and isinstance(bare, AffinePieces)
        and len(padded.pieces) == len(bare.pieces)
        and all(p[0] == q[0] for p, q in zip(padded.pieces, bare.pieces, strict=True))
    ):
        return AffinePieces(
            [
                (f, a - c, b - d)
                for (f, a, b), (_, c, d) in zip(padded.pieces, bare.pieces, strict=True)
            ]
        ).total(steps)
    out = 0.0
    for j in range(steps):
        out += padded.duration(j) - bare.duration(j)
    return out
