"""The roofline iteration-time model (``admit.cost.kind: roofline``): :class:`RooflineCost`.

From the model's shape (:mod:`~cpkv.serving.cost.shapes`), the GPU's datasheet peaks
(:mod:`~cpkv.serving.cost.gpus`), the tensor-parallel degree ``tp`` (weights, heads and the
MLP split over ``tp`` GPUs; KV heads too, replicated when fewer than ``tp``) and the
calibration (:mod:`~cpkv.serving.cost.calibration`), one iteration of ``T = prefill_tokens +
decode_requests`` tokens takes, on each GPU (all in microseconds; ``P`` peak FLOP/s, ``W`` HBM
bandwidth, ``layers`` the model's layers):

* **gemm** — per layer, four GEMMs (QKV, attention output, gate+up, down), each
  ``gemm_latency_us + combine(C, M)`` with ``C = 2·Tq·K·N / (gemm_flops_eff·P)`` (``Tq``: ``T``
  rounded up to ``gemm_tile_tokens``), ``M = (K·N·param_bytes + T·(K+N)·2) /
  (gemm_bw_eff·W)`` (weights read once, BF16 activations in and out) and ``combine(C, M) =
  (C^(1/c) + M^(1/c))^c`` for ``c = gemm_corner`` (``max(C, M)`` at 0); plus the LM head, the
  same GEMM on ``decode_requests`` tokens and one for the prefill (logits are computed for
  each sequence's last token only);
* **elementwise** — per layer, five memory-bound kernels (two RMSNorms, rotary embedding,
  activation, residual add): ``5·elementwise_latency_us + T·B / (elementwise_bw_eff·W)``,
  ``B`` the bytes each token reads and writes in them;
* **attention** — per layer, ``max(F / (attention_flops_eff·P), R / (attention_bw_eff·W))``
  for the prefill (``F = 4·head_dim·heads_per_gpu·prefill_attention_pairs``: QKᵀ and PV over
  the causal pairs; ``R`` = ``prefill_context_tokens`` x KV bytes per token and layer) and the
  same for decode (``F`` on ``decode_context_tokens`` pairs, ``R`` its KV): quadratic in a
  chunk's prefix and length for prefill, memory-bound for decode;
* **communication** — with ``tp > 1``, per layer two all-reduces (after attention and after
  the MLP) of ``T·hidden·2`` bytes over NVLink, each a latency and two bandwidth regimes
  (:func:`cpkv.serving.cost.allreduce.allreduce_us`: the low-latency one for the bytes up to
  ``allreduce_switch_bytes``, the bandwidth one beyond);
* **load** — ``loaded_tokens`` x this GPU's share of KV bytes per token /
  (``load_bw_eff`` x host-to-device bandwidth): each GPU copies its own heads, in parallel;
* **overhead** — the engine's CPU work the GPU waits for (:mod:`cpkv.serving.cost.cpu`:
  a fixed part, a part per sampled sequence and one per token; with overlap scheduling only
  what exceeds the gemm, elementwise and communication time), plus ``overhead_us``.

The time is the sum of the parts (nothing overlaps on the GPU: an upper bound for load-back
and all-reduce, which engines can overlap). An iteration with no token (``T = 0``) costs only
its load-back and overhead. The model FLOPs (for MFU) count the useful work of all GPUs: 2 x
parameters x tokens for the linear layers and the LM head, plus attention's
``4·head_dim·heads·(prefill_attention_pairs + decode_context_tokens)`` per layer; no tile
padding.

The attention, load and sum are written once (:meth:`RooflineCost._parts`), the dense parts
once (:meth:`RooflineCost._dense`); ``batch_us``, ``breakdown``, the vectorised
``breakdowns`` and ``stretch`` (:mod:`cpkv.serving.cost.stretch`: at most two affine pieces,
split where prefill attention's larger term changes) all take their numbers from them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cpkv.core.schema import to_dict
from cpkv.serving.cost.allreduce import allreduce_us, regimes_of
from cpkv.serving.cost.calibration import Calibration
from cpkv.serving.cost.cpu import ENGINE_CPU, EngineCpu
from cpkv.serving.cost.gpus import Gpu
from cpkv.serving.cost.shapes import ModelShape
from cpkv.serving.cost.stretch import AffinePieces

if TYPE_CHECKING:
    from cpkv.serving.cost.spec import CostSpec

ACTIVATION_BYTES = 2  # BF16 activations
ELEMENTWISE_KERNELS = 5  # input RMSNorm, rotary embedding, post-attention RMSNorm, activation, add
ALL_REDUCES_PER_LAYER = 2  # after the attention output projection and after the MLP
DENSE_MEMO = 1 << 16
"""``(tokens, head tokens)`` pairs whose dense parts a model remembers (then it starts over)."""
_NO_DENSE = (0.0, 0.0, 0.0, 0.0)  # (gemm, elementwise, communication, overhead): no growth
_FAR = float(1 << 62)
"""A stretch's crossing this many iterations away or more is never reached."""


def _flops_term(flops_us: Any, kv_us: Any) -> Any:
    """Prefill attention's FLOP term (:meth:`RooflineCost._parts`'s ``maximum`` for it)."""
    return flops_us


def _kv_term(flops_us: Any, kv_us: Any) -> Any:
    """Prefill attention's KV-read term."""
    return kv_us


def layer_gemms(shape: ModelShape, tp: int) -> tuple[tuple[int, int], ...]:
    """``(K, N)`` of one layer's four GEMMs on one GPU: QKV, attention output, gate+up, down."""
    heads = shape.heads // tp
    kv_heads = -(-shape.kv_heads // tp)
    mlp = -(-shape.mlp // tp)
    d, h = shape.head_dim, shape.hidden
    return (
        (h, (heads + 2 * kv_heads) * d),
        (heads * d, h),
        (h, (2 if shape.gated_mlp else 1) * mlp),
        (mlp, h),
    )


def elementwise_bytes_per_token(shape: ModelShape, tp: int) -> int:
    """Bytes one token reads and writes in one layer's elementwise kernels on one GPU: two
    RMSNorms (read and write ``hidden``), rotary embedding (read and write Q and K), the
    activation (gated: read gate and up, write one; else read and write one) and the
    residual add (read two, write one ``hidden``)."""
    heads, kv_heads = shape.heads // tp, -(-shape.kv_heads // tp)
    mlp = -(-shape.mlp // tp)
    act = (3 if shape.gated_mlp else 2) * mlp
    elements = (
        2 * 2 * shape.hidden + 2 * (heads + kv_heads) * shape.head_dim + act + 3 * shape.hidden
    )
    return elements * ACTIVATION_BYTES


def combine(compute_us: float, memory_us: float, corner: float) -> float:
    """``(C^(1/c) + M^(1/c))^c``: ``max`` at ``c = 0``, the sum at 1 (scaled: no overflow)."""
    if corner == 0.0:
        return compute_us if compute_us > memory_us else memory_us
    if corner == 1.0:
        return compute_us + memory_us
    if corner == 0.5:
        return math.hypot(compute_us, memory_us)
    top = compute_us if compute_us > memory_us else memory_us
    if top <= 0.0:
        return 0.0
    p = 1.0 / corner
    return top * ((compute_us / top) ** p + (memory_us / top) ** p) ** corner


class RooflineCost:
    """The roofline model of one deployment (shape, GPU, ``tp``, calibration); every constant
    of :meth:`breakdown` is computed here once."""

    kind = "roofline"
    __slots__ = (
        "shape", "gpu", "tp", "calibration", "names", "kv_bytes_per_token", "peak_flops_per_us",
        "gemm_tflops",
        "_gemms", "_head", "_lat", "_tile", "_corner", "_layers", "_elem_fixed", "_elem_token",
        "_allreduce", "_allreduce_bytes_per_token", "_attn_pair_us", "_attn_kv_us", "_attn_decode_us",
        "_load_token_us", "_overhead", "cpu", "_flops_token", "_flops_head", "_flops_pair",
        "_dense_memo", "_dense_known", "_stretch_constants", "_stretch_rates",
    )  # fmt: skip

    def __init__(
        self,
        shape: ModelShape,
        gpu: Gpu,
        tp: int = 1,
        calibration: Calibration | None = None,
        names: tuple[str | None, str | None] = (None, None),
        gemm_tflops: float | None = None,
        cpu: EngineCpu = ENGINE_CPU["none"],
    ) -> None:
        cal = calibration if calibration is not None else gpu.calibration_for(tp)
        self.cpu = cpu
        self.shape, self.gpu, self.tp, self.calibration, self.names = shape, gpu, tp, cal, names
        flops_us = gpu.peak_tflops * 1e6  # FLOPs per microsecond at peak
        bytes_us = gpu.hbm_gb_per_s * 1e3  # bytes per microsecond at peak
        self.gemm_tflops = gemm_tflops
        gemm_peak_us = flops_us if gemm_tflops is None else gemm_tflops * 1e6
        gemm_flops_us, gemm_bytes_us = cal.gemm_flops_eff * gemm_peak_us, cal.gemm_bw_eff * bytes_us
        pb = shape.param_bytes

        def gemm(k: int, n: int) -> tuple[float, float, float]:
            # (us per padded token of compute, us of weight reads, us per token of activations)
            return (
                2.0 * k * n / gemm_flops_us,
                k * n * pb / gemm_bytes_us,
                (k + n) * ACTIVATION_BYTES / gemm_bytes_us,
            )

        self._gemms = tuple(gemm(k, n) for k, n in layer_gemms(shape, tp))
        self._head = gemm(shape.hidden, -(-shape.vocab // tp))
        self._lat, self._tile, self._corner = (
            cal.gemm_latency_us,
            cal.gemm_tile_tokens,
            cal.gemm_corner,
        )
        self._layers = shape.layers
        self._elem_fixed = ELEMENTWISE_KERNELS * cal.elementwise_latency_us
        self._elem_token = elementwise_bytes_per_token(shape, tp) / (
            cal.elementwise_bw_eff * bytes_us
        )
        self._allreduce = regimes_of(cal)
        self._allreduce_bytes_per_token = shape.hidden * ACTIVATION_BYTES
        heads, kv_heads = shape.heads // tp, -(-shape.kv_heads // tp)
        kv_layer_bytes = 2 * kv_heads * shape.head_dim * shape.kv_bytes  # one token, one layer
        self._attn_pair_us = 4.0 * shape.head_dim * heads / (cal.attention_flops_eff * flops_us)
        self._attn_kv_us = kv_layer_bytes / (cal.attention_bw_eff * bytes_us)
        # decode: max(pair_us * c, kv_us * c) is max(pair_us, kv_us) * c, float for float
        # (rounding is monotone; c >= 0): one attention pair per context token
        self._attn_decode_us = max(self._attn_pair_us, self._attn_kv_us)
        load_bytes_us = cal.load_bw_eff * gpu.h2d_gb_per_s * 1e3
        self._load_token_us = shape.layers * kv_layer_bytes / load_bytes_us
        self._overhead = cal.overhead_us
        self.kv_bytes_per_token = shape.kv_bytes_per_token()
        self.peak_flops_per_us = tp * flops_us
        linear_params = sum(k * n for k, n in layer_gemms(shape, 1))
        self._flops_token = 2.0 * shape.layers * linear_params
        self._flops_head = 2.0 * shape.hidden * shape.vocab
        self._flops_pair = 4.0 * shape.layers * shape.head_dim * shape.heads
        self._dense_memo: dict[tuple[int, int], tuple[float, float, float]] = {}
        self._dense_known: tuple[Any, Any] | None = None
        self._stretch_constants: dict[tuple[int, int], float] = {}
        self._stretch_rates = (  # _parts's growth per decode context token, pair, prefill token
            self._parts(_NO_DENSE, 1, 0, 0, 0, _flops_term)[1],
            self._parts(_NO_DENSE, 0, 0, 1, 0, _flops_term)[1],
            self._parts(_NO_DENSE, 0, 1, 0, 0, _kv_term)[1],
        )  # _dense_many's: keys, (m, 3) parts

    # -- the per-iteration parts ---------------------------------------------------------------
    def gemm_us(self, tokens: int) -> float:
        """One layer's four GEMMs on ``tokens`` tokens (the linear-layer time the profiles
        measure)."""
        if tokens <= 0:
            return 0.0
        tile = self._tile
        padded = -(-tokens // tile) * tile
        corner = self._corner
        total = 0.0
        for c, w, a in self._gemms:
            total += self._lat + combine(c * padded, w + a * tokens, corner)
        return total

    def _head_us(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        c, w, a = self._head
        tile = self._tile
        return self._lat + combine(c * (-(-tokens // tile) * tile), w + a * tokens, self._corner)

    def _dense(self, tokens: int, head_tokens: int) -> tuple[float, float, float, float]:
        """``(gemm, elementwise, communication, overhead)`` for ``tokens`` tokens,
        ``head_tokens`` of them through the LM head (the sequences that sample a token): the
        parts fixed by the token counts (memoised, up to :data:`DENSE_MEMO` pairs: iterations
        repeat them). The overhead is the CPU work the GPU waits for, the other three its
        cover (:mod:`cpkv.serving.cost.cpu`), plus ``overhead_us``."""
        key = (tokens, head_tokens)
        parts = self._dense_memo.get(key)
        if parts is not None:
            return parts
        if tokens > 0:
            layers = self._layers
            gemm = layers * self.gemm_us(tokens) + self._head_us(head_tokens)
            elementwise = layers * (self._elem_fixed + self._elem_token * tokens)
            comm = 0.0
            if self.tp > 1:
                one = allreduce_us(
                    tokens * self._allreduce_bytes_per_token,
                    self.tp,
                    self.gpu.nvlink_gb_per_s,
                    self._allreduce,
                )
                comm = layers * ALL_REDUCES_PER_LAYER * one
            cover = gemm + elementwise + comm
            overhead = self._overhead + self.cpu.waited_us(tokens, head_tokens, cover)
            parts = (gemm, elementwise, comm, overhead)
        else:
            parts = (0.0, 0.0, 0.0, self._overhead + self.cpu.waited_us(0, 0, 0.0))
        if len(self._dense_memo) >= DENSE_MEMO:
            self._dense_memo.clear()
        self._dense_memo[key] = parts
        return parts

    def _parts(
        self,
        dense: tuple[Any, Any, Any],
        decode_context_tokens: Any,
        prefill_context_tokens: Any,
        prefill_attention_pairs: Any,
        loaded_tokens: Any,
        maximum: Any = None,
    ) -> tuple[Any, Any, Any]:
        """``(time_us, attention, load)`` from the dense parts (``(gemm, elementwise,
        communication, overhead)``, :meth:`_dense`) and the attention and load arguments: the one
        place the attention, the load and the time's sum are written (the module docstring),
        for numbers and, element-wise, numpy arrays.
        ``maximum`` picks the prefill attention's larger term: None for numbers (inline),
        ``numpy.maximum`` for arrays, or a function returning one of its two arguments (a
        stretch's branches, :meth:`stretch`)."""
        flops_us = self._attn_pair_us * prefill_attention_pairs
        kv_us = self._attn_kv_us * prefill_context_tokens
        if maximum is None:
            prefill = flops_us if flops_us > kv_us else kv_us
        else:
            prefill = maximum(flops_us, kv_us)
        attention = self._layers * (prefill + self._attn_decode_us * decode_context_tokens)
        load = self._load_token_us * loaded_tokens
        gemm, elementwise, communication, overhead = dense
        time_us = gemm + elementwise + attention + communication + load + overhead
        return time_us, attention, load

    def _flops(self, tokens: Any, head_tokens: Any, attention_pairs: Any) -> Any:
        """The model FLOPs of all GPUs (``attention_pairs``: prefill pairs + decode context)
        when ``tokens`` is not 0 (the caller's to zero)."""
        return (
            self._flops_token * tokens
            + self._flops_head * head_tokens
            + self._flops_pair * attention_pairs
        )

    def breakdown(
        self,
        prefill_tokens: int,
        decode_requests: int,
        decode_context_tokens: int,
        prefill_context_tokens: int,
        prefill_attention_pairs: int,
        loaded_tokens: int,
    ) -> tuple[float, ...]:
        """``(time_us, gemm, elementwise, attention, communication, load, overhead, flops)``."""
        tokens = prefill_tokens + decode_requests
        head_tokens = decode_requests + (1 if prefill_tokens else 0)
        dense = gemm, elementwise, comm, overhead = self._dense(tokens, head_tokens)
        time_us, attention, load = self._parts(
            dense, decode_context_tokens, prefill_context_tokens,
            prefill_attention_pairs, loaded_tokens,
        )  # fmt: skip
        flops = (
            self._flops(tokens, head_tokens, prefill_attention_pairs + decode_context_tokens)
            if tokens
            else 0.0
        )
        return (time_us, gemm, elementwise, attention, comm, load, overhead, flops)

    def batch_us(
        self,
        prefill_tokens: int,
        decode_requests: int,
        decode_context_tokens: int,
        prefill_context_tokens: int,
        prefill_attention_pairs: int,
        loaded_tokens: int,
    ) -> float:
        """Time of one iteration, in microseconds (:mod:`cpkv.serving.cost.base`): the first
        number of :meth:`breakdown`, by the same formula (without the FLOPs, which the time
        does not need)."""
        key = (prefill_tokens + decode_requests, decode_requests + (1 if prefill_tokens else 0))
        dense = self._dense_memo.get(key)  # (self._dense's memo, looked up here: the hot path)
        if dense is None:
            dense = self._dense(*key)
        return self._parts(
            dense, decode_context_tokens, prefill_context_tokens,
            prefill_attention_pairs, loaded_tokens,
        )[0]  # fmt: skip

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
        columns out (a float array each, or a float for a column equal in every iteration:
        the all-reduce without tensor parallelism), float for float: the GEMM, elementwise,
        all-reduce and overhead parts once per distinct ``(tokens, head tokens)``, the rest
        element-wise by the same formula (:meth:`_parts`)."""
        import numpy as np

        tokens = prefill_tokens + decode_requests
        head_tokens = decode_requests + (prefill_tokens != 0)
        gemm, elementwise, comm, overhead = self._dense_many(tokens, head_tokens)
        if self.tp <= 1:
            comm = 0.0  # (every iteration's: no all-reduce without tensor parallelism)
        time_us, attention, load = self._parts(
            (gemm, elementwise, comm, overhead), decode_context_tokens, prefill_context_tokens,
            prefill_attention_pairs, loaded_tokens, np.maximum,  # (no NaN here)
        )  # fmt: skip
        flops = self._flops(tokens, head_tokens, prefill_attention_pairs + decode_context_tokens)
        flops[tokens == 0] = 0.0
        return [time_us, gemm, elementwise, attention, comm, load, overhead, flops]

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
        """The durations of a stretch (:mod:`cpkv.serving.cost.stretch`; the decode context
        grows by ``decode_context_step``, default ``decode_requests``, a step): the token
        count is fixed, so the dense parts and the overhead are constant, decode attention
        is affine in the step, load is 0, and prefill attention is the larger of two
        affine terms (the pairs' FLOPs and the context's KV reads). :meth:`_parts` is
        linear in the contexts and pairs for a chosen term: its constant (no attention, no
        load; remembered by token counts) and its rates per decode context token, per pair
        and per prefill context token (:attr:`_stretch_rates`, taken from it once) give each
        term's line; one piece when the same term is the larger throughout, else two, split
        at their crossing."""
        step = decode_requests if decode_context_step is None else decode_context_step
        key = (prefill_tokens, decode_requests)
        constant = self._stretch_constants.get(key)
        if constant is None:  # the time with no attention and no load: the dense parts
            if len(self._stretch_constants) >= DENSE_MEMO:
                self._stretch_constants.clear()
            dense = self._dense(
                prefill_tokens + decode_requests, decode_requests + (1 if prefill_tokens else 0)
            )
            constant = self._stretch_constants[key] = self._parts(dense, 0, 0, 0, 0)[0]
        decode_us, flops_us, kv_us = self._stretch_rates
        base = constant + decode_us * decode_context_tokens
        slope = decode_us * step
        a_flops = base + flops_us * prefill_attention_pairs
        a_kv = base + kv_us * prefill_context_tokens
        b_flops = slope + flops_us * prefill_attention_pairs_step
        b_kv = slope + kv_us * prefill_context_step
        if a_flops > a_kv:  # (as the per-iteration max: a tie takes the KV term)
            a, b, a_later, b_later = a_flops, b_flops, a_kv, b_kv
        else:
            a, b, a_later, b_later = a_kv, b_kv, a_flops, b_flops
        if b_later <= b:
            return AffinePieces(((0, a, b),))
        crossing = (a - a_later) / (b_later - b)  # the other term is larger after it
        if not crossing < _FAR:
            return AffinePieces(((0, a, b),))
        return AffinePieces(((0, a, b), (math.floor(crossing) + 1, a_later, b_later)))

    def _dense_many(self, tokens: Any, head_tokens: Any) -> tuple[Any, ...]:
        """:meth:`_dense` of each ``(tokens, head tokens)`` pair, as four arrays: computed
        once per distinct pair (runs of equal pairs, as decode stretches log them, first
        taken as one)."""
        import numpy as np

        n = len(tokens)
        if not n:
            return np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)
        if int(tokens.max()) >= 1 << 31 or int(head_tokens.max()) >= 1 << 32:  # not one key
            pairs = list(zip(tokens.tolist(), head_tokens.tolist(), strict=True))
            dense = np.array([self._dense(t, h) for t, h in pairs], dtype=float).reshape(-1, 4)
            return tuple(dense[:, j] for j in range(4))
        key = np.left_shift(np.asarray(tokens, dtype=np.int64), 32)
        key |= np.asarray(head_tokens, dtype=np.int64)
        heads = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        keys, where = np.unique(key[heads], return_inverse=True)
        dense = self._dense_of(keys)
        lengths = np.diff(np.append(heads, n))
        where = where.reshape(-1)
        return tuple(np.repeat(dense[where, j], lengths) for j in range(4))

    def _dense_of(self, keys: Any) -> Any:
        """:meth:`_dense` of each packed ``tokens << 32 | head tokens`` of ``keys`` (sorted,
        distinct), as a ``(len(keys), 4)`` array: those seen before (up to
        :data:`DENSE_MEMO`) looked up, the others computed and remembered."""
        import numpy as np

        known, parts = getattr(self, "_dense_known", None) or (
            np.zeros(0, np.int64),
            np.zeros((0, 4)),
        )
        at = np.searchsorted(known, keys)
        found = at < len(known)
        found[found] = known[at[found]] == keys[found]
        if not found.all():
            new = keys[~found]
            computed = np.array(
                [self._dense(int(k >> 32), int(k & 0xFFFFFFFF)) for k in new.tolist()],
                dtype=float,
            ).reshape(-1, 4)
            if len(known) + len(new) > DENSE_MEMO:  # start over with these
                known, parts = keys[found], parts[at[found]]
            known = np.concatenate([known, new])
            order = np.argsort(known, kind="stable")
            known, parts = known[order], np.concatenate([parts, computed])[order]
            self._dense_known = (known, parts)
            at = np.searchsorted(known, keys)
        return parts[at]

    def describe(self) -> dict[str, Any]:
        """Kind, model, GPU, TP and every number the model uses, as a plain dict."""
        model, gpu = self.names
        return {
            "kind": "roofline",
            "model": model,
            "gpu": gpu,
            "tp": self.tp,
            "shape": {k: v for k, v in to_dict(self.shape).items() if k != "hf_id"},
            "gpu_spec": {
                k: v
                for k, v in to_dict(self.gpu).items()
                if k not in ("calibration", "profile_prefix", "fp8_tflops", "allreduce_by_workers")
            },
            "calibration": to_dict(self.calibration),
            "cpu": to_dict(self.cpu),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            **({} if self.gemm_tflops is None else {"gemm_fp8_tflops": self.gemm_tflops}),
        }


def build_roofline(spec: CostSpec) -> RooflineCost:
    """The roofline model of an ``admit.cost`` block (``kind: roofline``)."""
    from cpkv.serving.cost.gpus import resolve_gpu

    gpu = resolve_gpu(spec.gpu, spec.gpu_spec)
    calibration = spec.calibration.resolve(gpu.calibration_for(spec.tp))
    gemm_tflops = gpu.fp8_tflops if spec.quantization == "fp8" else None
    cpu = spec.cpu.resolve(spec.cpu.engine or "sglang")
    return RooflineCost(
        spec.shape(), gpu, spec.tp, calibration, (spec.model, spec.gpu), gemm_tflops, cpu
    )


def mfu_pct(flops: float, seconds: float, peak_flops_per_us: float | None) -> float | None:
    """Model FLOPs utilisation in percent: ``flops`` over ``seconds`` at the model's peak."""
    if peak_flops_per_us is None or seconds <= 0 or not math.isfinite(seconds):
        return None
    return 100.0 * flops / (seconds * 1e6 * peak_flops_per_us)
