""":class:`CpRooflineCost`: the roofline model of one CP rank with the CP terms added.

An iteration without prefill tokens (a decode batch, or a decode stretch) is the roofline
model's, unchanged: CP splits prefill only. An iteration with prefill tokens is priced on one
rank (the ranks run in parallel): the roofline model of the rank's share (:func:`.work.split`)
attending to the whole batch's context, the fullest owner lane's load-back, then the terms of
:mod:`.work` added to the parts they belong to: the exchange and the materialisation to
``communication``, the top-k to ``attention``, the load-back's pages to ``load``, the
descriptors to ``overhead``. Decoding requests in the same iteration (a mixed batch) run on
the rank in full (an upper bound). The FLOPs are the whole iteration's (every rank's useful
work), the peak that of all ``n × tp`` GPUs.
"""

from __future__ import annotations

from typing import Any

from cpkv.serving.cost.cp import work as w
from cpkv.serving.cost.stretch import AffinePieces, Looped

TERMS = ("exchange_us", "materialise_us", "topk_us", "load_back_us", "descriptors_us")
"""The CP terms of an iteration, in the order :meth:`CpRooflineCost.terms` gives them."""


class CpRooflineCost:
    """The roofline model ``inner`` (one rank) on ``work.size`` CP ranks (module docstring)."""

    kind = "roofline"

    def __init__(self, inner: Any, work: w.CpWork) -> None:
        self.inner, self.cp_work = inner, work
        self.kv_bytes_per_token = inner.kv_bytes_per_token
        self.peak_flops_per_us = inner.peak_flops_per_us * work.size

    def _price(
        self, prefill: int, decode: int, decode_context: int, prefill_context: int, pairs: int,
        loaded: int,
    ) -> tuple[tuple[float, ...], tuple[float, ...]]:  # fmt: skip
        """(the rank's roofline breakdown, the CP terms) of an iteration with prefill."""
        work = self.cp_work
        tokens, rank_pairs = w.split(prefill, pairs, work.size)
        lane = w.load_back_pages(work, loaded) * work.page_size
        rank_loaded = loaded if loaded < lane else lane
        rank = self.inner.breakdown(
            tokens, decode, decode_context, prefill_context, rank_pairs, rank_loaded
        )
        cached = prefill_context - prefill
        terms = (
            w.exchange_us(work, prefill, rank[3] / work.layers),
            w.materialise_us(work, cached),
            w.topk_us(work, tokens, prefill_context, rank_pairs),
            w.load_back_us(work, loaded),
            w.descriptors_us(work, prefill_context),
        )
        return rank, terms

    def terms(
        self, prefill: int, decode: int, decode_context: int, prefill_context: int, pairs: int,
        loaded: int,
    ) -> dict[str, float]:  # fmt: skip
        """The CP terms of an iteration by name (:data:`TERMS`; all 0 without prefill)."""
        if not prefill:
            return dict.fromkeys(TERMS, 0.0)
        return dict(zip(TERMS, self._price(
            prefill, decode, decode_context, prefill_context, pairs, loaded)[1], strict=True))  # fmt: skip

    def breakdown(
        self, prefill: int, decode: int, decode_context: int, prefill_context: int, pairs: int,
        loaded: int,
    ) -> tuple[float, ...]:  # fmt: skip
        """``(time_us, gemm, elementwise, attention, communication, load, overhead, flops)``."""
        args = (prefill, decode, decode_context, prefill_context, pairs, loaded)
        if not prefill:
            return self.inner.breakdown(*args)
        rank, (exchange, materialise, topk, load_back, descriptors) = self._price(*args)
        _, gemm, elementwise, attention, comm, load, overhead, _ = rank
        attention = attention + topk
        comm = comm + exchange + materialise
        load = load + load_back
        overhead = overhead + descriptors
        time_us = gemm + elementwise + attention + comm + load + overhead
        flops = self.inner.breakdown(*args)[7]
        return (time_us, gemm, elementwise, attention, comm, load, overhead, flops)

    def batch_us(
        self, prefill: int, decode: int, decode_context: int, prefill_context: int, pairs: int,
        loaded: int,
    ) -> float:  # fmt: skip
        """The iteration's time: :meth:`breakdown`'s first number."""
        if not prefill:
            return self.inner.batch_us(
                prefill, decode, decode_context, prefill_context, pairs, loaded
            )
        return self.breakdown(prefill, decode, decode_context, prefill_context, pairs, loaded)[0]

    def breakdowns(self, prefill, decode, decode_context, prefill_context, pairs, loaded):
        """:meth:`breakdown` of many iterations: the roofline model's vectorised columns,
        the rows with prefill tokens replaced by :meth:`breakdown`'s."""
        import numpy as np

        from cpkv.serving.cost.report import breakdown_columns

        args = (prefill, decode, decode_context, prefill_context, pairs, loaded)
        columns = breakdown_columns(self.inner, *args)
        rows = np.flatnonzero(np.asarray(prefill) != 0)
        if not len(rows):
            return columns
        n = len(prefill)
        columns = [np.full(n, c) if np.ndim(c) == 0 else c for c in columns]
        for i in rows.tolist():
            row = self.breakdown(*(int(a[i]) for a in args))
            for j, value in enumerate(row):
                columns[j][i] = value
        return columns

    def stretch(
        self, prefill: int, decode: int, decode_context: int, prefill_context: int, pairs: int,
        prefill_context_step: int, pairs_step: int, *, decode_context_step: int | None = None,
    ) -> AffinePieces | Looped:  # fmt: skip
        """A decode stretch: the roofline model's (closed form, unchanged); a stretch with
        prefill tokens: iteration by iteration (:class:`~cpkv.serving.cost.stretch.Looped`)."""
        args = (
            prefill, decode, decode_context, prefill_context, pairs, prefill_context_step,
            pairs_step,
        )  # fmt: skip
        if not prefill:
            return self.inner.stretch(*args, decode_context_step=decode_context_step)
        return Looped(self, args, decode_context_step)

    def describe(self) -> dict[str, Any]:
        """The roofline model's description with the CP block added."""
        work = self.cp_work
        return {
            **self.inner.describe(),
            "cp": {
                "size": work.size,
                "kv_exchange": work.exchange,
                "page_size": work.page_size,
                "token_bytes": work.token_bytes,
                "score_write_us": work.score_write_us,
                "score_pair_us": work.score_pair_us,
                "descriptor_page_us": work.descriptor_page_us,
                "descriptor_fixed_us": work.descriptor_fixed_us,
                "load_back_page_us": work.load_back_page_us,
            },
        }

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # (not set yet: no recursion)
            raise AttributeError(name)
        return getattr(self.inner, name)


def build_cp(inner: Any, spec: Any) -> CpRooflineCost:
    """The CP model of ``admit.cost`` (``spec``, a ``CostSpec`` with ``cp.size`` > 1) around
    its roofline model ``inner``."""
    from cpkv.serving.cost.allreduce import regimes_of
    from cpkv.serving.cost.layers.attention import attention_work

    cp, shape = spec.cp, inner.shape
    attn = attention_work(shape, inner.tp)
    token_bytes = float(shape.kv_layer_bytes() if shape.mla else attn.context_token_bytes)
    score_write_us = score_pair_us = 0.0
    if attn.topk > 0:
        token_bytes += attn.index_token_bytes
        hbm = inner.gpu.hbm_gb_per_s * 1e3 * inner.calibration.elementwise_bw_eff
        score_write_us = w.SCORE_BYTES / hbm
        score_pair_us = w.SCORE_BYTES * cp.topk_passes / hbm
    work = w.CpWork(
        size=cp.size, layers=shape.layers, token_bytes=token_bytes,
        link_gb_per_s=inner.gpu.nvlink_gb_per_s,
        regimes=regimes_of(inner.gpu.calibration_for(cp.size)), score_write_us=score_write_us,
        score_pair_us=score_pair_us,
        exchange="ring" if cp.kv_exchange == "ring" else "all_gather", page_size=cp.page_size,
        descriptor_page_us=cp.descriptor_page_us, descriptor_fixed_us=cp.descriptor_fixed_us,
        load_back_page_us=cp.load_back_page_us,
    )  # fmt: skip
    return CpRooflineCost(inner, work)
