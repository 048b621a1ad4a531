"""The linear iteration-time model (``admit.cost.kind: linear``): :class:`CostModel`.

(:mod:`cpkv.serving.cost.base` is the interface every kind offers; ``roofline``, the default
kind, is :mod:`cpkv.serving.cost.roofline`.) One iteration (one forward pass: every running
request decodes a token, plus this iteration's prefill chunks) takes

    time_us = fixed_us
            + prefill_token_us  * prefill_tokens     (prompt tokens computed)
            + decode_request_us * decode_requests    (running requests that decode a token)
            + context_token_us  * context_tokens     (KV tokens the attention reads)
            + loaded_tokens * kv_bytes_per_token / (l2_load_gb_per_s * 1e3)   (L2 -> L1 load-back)

``context_tokens`` is, for each decoding request, its whole context (prompt, cached prefix
included, plus generated tokens) and, for each prefill chunk, the tokens before the chunk
plus the chunk. ``loaded_tokens`` are the L2 hits loaded back by the requests admitted in
the iteration; the copy is not overlapped with compute (an upper bound).
``l2_load_gb_per_s: null`` makes load-back free.

The defaults are illustrative, not measured: rough numbers for an 8B dense model in BF16
on one H100-class GPU (16 GB of weights read per step ~ 5 ms; ~16 GFLOP per token at
~550 TFLOP/s ~ 30 us; Llama-3-8B KV: 32 layers x 8 KV heads x 128 dims x 2 x 2 bytes =
128 KiB per token, read at ~3.3 TB/s ~ 0.04 us; PCIe 5.0 x16 host-to-device ~ 50 GB/s).
Fit them to a real engine with ``admit.cost.fit_points`` or ``cpkv fit-cost``
(:mod:`cpkv.serving.cost.fitting.linear`).

:meth:`CostModel.breakdown` names the terms as the roofline model's parts: the per prefill
token and per decoding request terms are ``gemm``, the per context token term
``attention``, load-back ``load``, ``fixed_us`` the ``overhead``; no FLOPs (no MFU). The
formula is written once (:meth:`CostModel._terms`); ``batch_us``, ``breakdown``,
``breakdowns`` and ``stretch`` (one affine piece: :mod:`cpkv.serving.cost.stretch`) all take
their numbers from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cpkv.core.schema import non_negative, positive
from cpkv.serving.cost.stretch import AffinePieces

if TYPE_CHECKING:
    from cpkv.serving.cost.spec import CostSpec

FEATURES = ("prefill_tokens", "decode_requests", "context_tokens", "loaded_tokens")
"""The per-iteration quantities the model charges for, besides the fixed cost."""


@dataclass(frozen=True)
class CostModel:
    """The linear model's coefficients (``admit.cost`` with ``kind: linear``; see the module
    docstring)."""

    fixed_us: float = 5000.0
    prefill_token_us: float = 30.0
    decode_request_us: float = 30.0
    context_token_us: float = 0.04
    kv_bytes_per_token: int = 131072
    l2_load_gb_per_s: float | None = 50.0

    kind = "linear"
    peak_flops_per_us = None  # no FLOPs: no MFU

    def validate(self) -> None:
        for key in ("fixed_us", "prefill_token_us", "decode_request_us", "context_token_us"):
            non_negative(key, getattr(self, key))
        positive("kv_bytes_per_token", self.kv_bytes_per_token)
        positive("l2_load_gb_per_s", self.l2_load_gb_per_s, allow_none=True)

    def __post_init__(self) -> None:
        try:  # (frozen: set once; kept out of the fields, so out of ==, repr and replace)
            coefficients: tuple[float, ...] | None = self.coefficients()
        except (TypeError, ZeroDivisionError):  # not a valid model: validate() says why
            coefficients = None
        object.__setattr__(self, "_coefficients", coefficients)

    @property
    def load_token_us(self) -> float:
        """Microseconds to load one KV token from L2 (0 when load-back is free)."""
        if self.l2_load_gb_per_s is None:
            return 0.0
        return self.kv_bytes_per_token / (self.l2_load_gb_per_s * 1e3)

    def coefficients(self) -> tuple[float, float, float, float, float]:
        """``(fixed, prefill, decode, context, load)`` in microseconds per unit of FEATURES."""
        return (
            self.fixed_us,
            self.prefill_token_us,
            self.decode_request_us,
            self.context_token_us,
            self.load_token_us,
        )

    def _terms(
        self, prefill_tokens: Any, decode_requests: Any, context_tokens: Any, loaded_tokens: Any
    ) -> tuple[Any, Any, Any, Any, Any]:
        """The model's formula (the module docstring), term by term: ``(time, fixed,
        prefill, decode, context, load)`` in microseconds, the time their sum left to right.
        The one place the formula is written: every other method (one iteration, numpy
        arrays of many, a stretch) takes its numbers from here, so they agree float for
        float, element-wise."""
        fixed, pre, dec, ctx, load = self._coefficients
        prefill = pre * prefill_tokens
        decode = dec * decode_requests
        context = ctx * context_tokens
        load_us = load * loaded_tokens
        return (
            fixed + prefill + decode + context + load_us,
            fixed,
            prefill,
            decode,
            context,
            load_us,
        )

    def iteration_us(
        self, prefill_tokens: int, decode_requests: int, context_tokens: int, loaded_tokens: int
    ) -> float:
        """Time of one iteration, in microseconds."""
        return self._terms(prefill_tokens, decode_requests, context_tokens, loaded_tokens)[0]

    def batch_us(
        self,
        prefill_tokens: int,
        decode_requests: int,
        decode_context_tokens: int,
        prefill_context_tokens: int,
        prefill_attention_pairs: int,
        loaded_tokens: int,
    ) -> float:
        """Time of one iteration as the serving loop describes it (the interface every cost
        model offers): ``decode_context_tokens`` is the context the decoding requests read,
        ``prefill_context_tokens`` the sum over prefill chunks of (tokens before the chunk +
        the chunk), ``prefill_attention_pairs`` the query-key pairs causal prefill attention
        computes: for a chunk of ``e`` tokens after ``p`` tokens, ``e * p + e * (e + 1) / 2``
        (each new token attends to everything before it and to itself), summed over chunks.
        The linear model charges both contexts alike and ignores the pairs."""
        return self._terms(
            prefill_tokens,
            decode_requests,
            decode_context_tokens + prefill_context_tokens,
            loaded_tokens,
        )[0]

    def breakdown(
        self,
        prefill_tokens: int,
        decode_requests: int,
        decode_context_tokens: int,
        prefill_context_tokens: int,
        prefill_attention_pairs: int,
        loaded_tokens: int,
    ) -> tuple[float, ...]:
        """``(time_us, gemm, elementwise, attention, communication, load, overhead, flops)``
        (:mod:`cpkv.serving.cost.base`); ``time_us`` is :meth:`batch_us`'s, float for float."""
        return self._columns(
            prefill_tokens,
            decode_requests,
            decode_context_tokens + prefill_context_tokens,
            loaded_tokens,
        )

    def breakdowns(
        self,
        prefill_tokens: Any,
        decode_requests: Any,
        decode_context_tokens: Any,
        prefill_context_tokens: Any,
        prefill_attention_pairs: Any,
        loaded_tokens: Any,
    ) -> list[Any]:
        """:meth:`breakdown` of many iterations at once: integer numpy arrays in, the eight
        columns out (:mod:`cpkv.serving.cost.base`: a float array each, or a float for a
        column equal in every iteration) whose ``i``-th elements are ``breakdown`` of the
        arrays' ``i``-th elements, float for float (the same formula, element-wise)."""
        return list(
            self._columns(
                prefill_tokens,
                decode_requests,
                decode_context_tokens + prefill_context_tokens,
                loaded_tokens,
            )
        )

    def _columns(
        self, prefill_tokens: Any, decode_requests: Any, context_tokens: Any, loaded_tokens: Any
    ) -> tuple[Any, ...]:
        """:meth:`_terms` as the breakdown's eight numbers (numbers or arrays): the prefill
        and decode terms are the GEMM part, the context term attention, ``fixed`` the
        overhead."""
        time_us, fixed, prefill, decode, context, load_us = self._terms(
            prefill_tokens, decode_requests, context_tokens, loaded_tokens
        )
        return (time_us, prefill + decode, 0.0, context, 0.0, load_us, fixed, 0.0)

    def stretch(
        self,
        prefill_tokens: int,
        decode_requests: int,
        decode_context_tokens: int,
        prefill_context_tokens: int,
        prefill_attention_pairs: int,
        prefill_context_step: int,
        prefill_attention_pairs_step: int,
        *,
        decode_context_step: int | None = None,
    ) -> AffinePieces:
        """The durations of a stretch (:mod:`cpkv.serving.cost.stretch`): one affine piece.
        The context grows by ``decode_context_step`` (default ``decode_requests``) +
        ``prefill_context_step`` a step, nothing else changes (nothing loaded), so iteration
        ``j`` takes ``batch_us`` of the first iteration plus ``j`` times the context term
        of that growth."""
        step = decode_requests if decode_context_step is None else decode_context_step
        first = self._terms(
            prefill_tokens, decode_requests, decode_context_tokens + prefill_context_tokens, 0
        )[0]
        growth = self._terms(0, 0, step + prefill_context_step, 0)[4]  # the context term
        return AffinePieces(((0, first, growth),))

    def describe(self) -> dict[str, float | int | str | None]:
        """The kind and the coefficients as a plain dict (for summaries, notes, fit-cost)."""
        return {
            "kind": "linear",
            "fixed_us": self.fixed_us,
            "prefill_token_us": self.prefill_token_us,
            "decode_request_us": self.decode_request_us,
            "context_token_us": self.context_token_us,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "l2_load_gb_per_s": self.l2_load_gb_per_s,
        }


def build_linear(spec: CostSpec) -> CostModel:
    """The linear model of an ``admit.cost`` block (``kind: linear``)."""
    return CostModel(
        spec.fixed_us,
        spec.prefill_token_us,
        spec.decode_request_us,
        spec.context_token_us,
        spec.kv_bytes_per_token,
        spec.l2_load_gb_per_s,
    )
