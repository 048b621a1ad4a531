"""CUDA-graph decode buckets in the serving loop's time (``admit.serving.cuda_graph_buckets``):
a decode-only batch runs the graph of the smallest captured batch size at least its size
(:func:`~cpkv.policies.budgets.graph_bucket`); the padding requests cost decode time."""

from __future__ import annotations

from typing import Any

from cpkv.policies.budgets import graph_bucket


class PaddedDecodeCost:
    """A cost model whose decode-only batches run at their CUDA-graph bucket size: the
    padding requests cost decode time (no context) and are counted. Wrapping
    the model also turns off the loop's inline linear arithmetic (every duration comes from
    here)."""

    def __init__(self, inner: Any, buckets: tuple[int, ...]) -> None:
        self.inner, self.buckets = inner, buckets
        self.padding_requests = 0  # padding requests over every padded batch
        self.padding_us = 0.0  # the decode time they cost

    def batch_us(self, prefill, decode, decode_context, prefill_context, pairs, loaded) -> float:
        inner = self.inner
        if prefill or loaded or not decode:
            return inner.batch_us(prefill, decode, decode_context, prefill_context, pairs, loaded)
        size = graph_bucket(decode, self.buckets)
        padded = inner.batch_us(0, size, decode_context, 0, 0, 0)
        if size > decode:
            self.padding_requests += size - decode
            self.padding_us += padded - inner.batch_us(0, decode, decode_context, 0, 0, 0)
        return padded

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
        if not (prefill or loaded or not decode):
            decode = graph_bucket(decode, self.buckets)
        return self.inner.breakdown(prefill, decode, decode_context, prefill_context, pairs, loaded)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
