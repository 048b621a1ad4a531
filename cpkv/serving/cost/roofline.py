"""The roofline iteration-time model (``admit.cost.kind: roofline``): :class:`RooflineCost`.

From the model's shape (:mod:`~cpkv.serving.cost.shapes`: dense, latent or sparse attention,
dense MLPs or experts), the GPU's datasheet peaks (:mod:`~cpkv.serving.cost.gpus`), the
parallelism (``tp`` GPUs a pipeline stage sharing every layer's heads and MLP, ``ep`` of them
holding whole experts, ``pp`` stages), the calibration (:mod:`~cpkv.serving.cost.calibration`)
and the engine's CPU work (:mod:`~cpkv.serving.cost.cpu`), one iteration of ``T =
prefill_tokens + decode_requests`` tokens, ``head`` sequences of which sample a token (the
decoding requests and one for the prefill), takes on each GPU (all in microseconds; the unit
times per GEMM, per layer and per attention unit are :mod:`cpkv.serving.cost.layers.timing`'s):

* **gemm** — every layer's GEMMs (attention projections; the dense MLP, or the router, the
  shared experts and the routed experts' two grouped GEMMs), plus the LM head on ``head``
  tokens (logits for each sequence's last token only);
* **elementwise** — every layer's five memory-bound kernels;
* **attention** — per layer, prefill ``max(F, R)``: ``F`` the causal pairs' FLOPs (at most
  ``index_topk`` keys a query with sparse attention, plus the indexer's FLOPs on every pair,
  plus the up-projection of the cached prefixes' latents with MLA), ``R`` the prefill
  contexts' cache reads; and decode, each context token the larger of its pair's FLOPs and
  its cache read (at most ``index_topk`` tokens a request with sparse attention, plus the
  indexer's every token): quadratic in a chunk's prefix and length for prefill;
* **communication** — with ``tp > 1`` two all-reduces a layer (a layer of experts under
  expert parallelism: one, and the dispatch and combine all-to-alls), each the engine's
  custom kernels for small messages or NCCL's (``allreduce``:
  :mod:`cpkv.serving.cost.allreduce`), with ``pp > 1`` the activations sent between stages;
* **load** — ``loaded_tokens`` x this GPU's share of a token's KV bytes / (``load_bw_eff`` x
  host-to-device bandwidth): each GPU copies its own layers and heads, in parallel;
* **overhead** — the engine's CPU work the GPU waits for (a fixed part, a part per sampled
  sequence and one per token; with overlap scheduling only what exceeds the gemm,
  elementwise and communication time), plus ``overhead_us``.

With ``pp > 1`` the iteration's sequences go through the stages as ``m = min(pp, head)``
micro-batches (:mod:`cpkv.serving.cost.layers.pipeline`): the layers' parts are those of
``⌈T/m⌉`` tokens (the LM head's of ``⌈head/m⌉``) and attention ``1/m`` of the iteration's, all
times the slowest stage's factor, plus ``pp − 1`` transfers.

The time is the sum of the parts (nothing overlaps on the GPU: an upper bound for load-back
and all-reduce, which engines can overlap). An iteration with no token (``T = 0``) costs only
its load-back and overhead. The model FLOPs (for MFU) count the useful work of all GPUs: 2 x
active parameters x tokens for the linear layers and the LM head, plus attention's FLOPs as
above (no tile padding, no replicated work counted twice).

The attention, load and sum are written once (:meth:`RooflineCost._parts`), the parts fixed by
the token counts once (:meth:`RooflineCost._dense`); ``batch_us``, ``breakdown``, the
vectorised ``breakdowns`` and ``stretch`` (:mod:`cpkv.serving.cost.stretch`: at most two affine
pieces, split where prefill attention's larger term changes; iteration by iteration for sparse
attention, whose caps make the durations bend where no line follows) all take their numbers
from them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

from cpkv.core.schema import to_dict
from cpkv.serving.cost.calibration import Calibration
from cpkv.serving.cost.cpu import ENGINE_CPU, EngineCpu
from cpkv.serving.cost.gpus import Gpu
from cpkv.serving.cost.layers.attention import attention_work
from cpkv.serving.cost.layers.dense import attention_gemms, mlp_gemms
from cpkv.serving.cost.layers.experts import moe_side_gemms
from cpkv.serving.cost.layers.pipeline import micro_batches, stage_factor
from cpkv.serving.cost.layers.timing import DeploymentTimes
from cpkv.serving.cost.shapes import ModelShape
from cpkv.serving.cost.stretch import AffinePieces, Looped

if TYPE_CHECKING:
    from cpkv.serving.cost.spec import CostSpec

DENSE_MEMO = 1 << 16
"""``(tokens, head tokens)`` pairs whose dense parts a model remembers (then it starts over)."""
DENSE_PARTS = 5  # gemm, elementwise, communication, overhead, attention's layers
_FAR: Final = float(1 << 62)
"""A stretch's crossing this many iterations away or more is never reached."""


def active_params(shape: ModelShape) -> int:
    """The weights one token goes through in the linear layers and the LM head (embeddings
    and norms left out; a layer of experts counts its router, shared experts and
    ``experts_per_token`` routed experts)."""
    layer = sum(k * n for k, n in attention_gemms(shape, 1))
    dense = sum(k * n for k, n in mlp_gemms(shape.hidden, shape.mlp, shape.gated_mlp, 1))
    total = shape.layers * layer + (shape.layers - shape.moe_layers) * dense
    if shape.moe:
        expert = (3 if shape.gated_mlp else 2) * shape.hidden * shape.expert_mlp
        side = sum(k * n for k, n in moe_side_gemms(shape, 1))
        total += shape.moe_layers * (side + shape.experts_per_token * expert)
    return total + shape.hidden * shape.vocab


GPU_SPEC_LEFT_OUT = frozenset(
    {"calibration", "profile_prefix", "fp8_tflops", "allreduce_by_workers", "custom_allreduce"}
)
"""The fields of a :class:`~cpkv.serving.cost.gpus.Gpu` that the summary's ``gpu_spec`` leaves
out (not datasheet numbers; FP8's peak is ``gemm_fp8_tflops`` when used)."""


class RooflineCost:
    """The roofline model of one deployment (shape, GPU, parallelism, calibration, CPU); every
    constant of :meth:`breakdown` is computed here once."""

    kind = "roofline"
    __slots__ = (
        "shape", "gpu", "tp", "pp", "ep", "allreduce", "calibration", "names", "kv_bytes_per_token",
        "peak_flops_per_us", "gemm_tflops", "cpu", "times", "_layers", "_sparse", "_simple",
        "_topk", "_pair_us", "_context_us", "_decode_us", "_prefix_us", "_load_token_us", "_overhead", "_flops_token", "_flops_head", "_flops_units",
        "_dense_memo", "_dense_known", "_stretch_constants",
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
        pp: int = 1,
        ep: int = 1,
        allreduce: str = "nccl",
    ) -> None:
        cal = calibration if calibration is not None else gpu.calibration_for(tp)
        self.shape, self.gpu, self.tp, self.calibration, self.names = shape, gpu, tp, cal, names
        self.pp, self.ep, self.cpu, self.gemm_tflops = pp, ep, cpu, gemm_tflops
        self.allreduce = allreduce
        times = self.times = DeploymentTimes(shape, gpu, tp, ep, cal, gemm_tflops, allreduce)
        self._layers = shape.layers
        self._sparse = times.topk > 0
        self._topk = times.topk
        self._simple = not self._sparse and times.prefix_us == 0.0  # grouped-query attention
        self._pair_us, self._context_us, self._decode_us, self._prefix_us = (  # (one lookup)
            times.pair_us,
            times.context_us,
            times.decode_us,
            times.prefix_us,
        )
        stage_layers = -(-shape.layers // pp)
        self._load_token_us = stage_layers * times.load_layer_us
        self._overhead = cal.overhead_us
        self.kv_bytes_per_token = shape.kv_bytes_per_token()
        self.peak_flops_per_us = tp * pp * gpu.peak_tflops * 1e6
        work = attention_work(shape, 1)
        self._flops_token = 2.0 * (active_params(shape) - shape.hidden * shape.vocab)
        self._flops_head = 2.0 * shape.hidden * shape.vocab
        self._flops_units = tuple(
            shape.layers * f
            for f in (work.prefill_pair_flops, work.decode_pair_flops, work.prefix_token_flops,
                      work.index_pair_flops)
        )  # fmt: skip
        self._dense_memo: dict[tuple[int, int], tuple[float, ...]] = {}
        self._dense_known: tuple[Any, Any] | None = None
        self._stretch_constants: dict[tuple[int, int], tuple[float, float]] = {}

    # -- the per-iteration parts ---------------------------------------------------------------
    def gemm_us(self, tokens: int) -> float:
        """One layer's GEMMs on ``tokens`` tokens, the first layers' kind (a dense model's four:
        the linear-layer time the profiles measure)."""
        kind = self.times.kinds[0]
        total = self.times.gemm_us(kind.gemms, tokens)
        if kind.experts is not None:
            total += self.times.experts_us(kind.experts, tokens)
        return total

    def _dense(self, tokens: int, head_tokens: int) -> tuple[float, ...]:
        """``(gemm, elementwise, communication, overhead, attention's layers)`` for ``tokens``
        tokens, ``head_tokens`` of them through the LM head (the sequences that sample a
        token): the parts fixed by the token counts (memoised, up to :data:`DENSE_MEMO`
        pairs: iterations repeat them). The overhead is the CPU work the GPU waits for, the
        other three its cover (:mod:`cpkv.serving.cost.cpu`), plus ``overhead_us``; the
        attention's layers multiply one layer's attention of the iteration (the layers, times
        ``factor / m`` in a pipeline)."""
        key = (tokens, head_tokens)
        parts = self._dense_memo.get(key)
        if parts is not None:
            return parts
        times = self.times
        if tokens > 0:
            micro, factor = 1, 1.0
            if self.pp > 1:
                micro = micro_batches(self.pp, head_tokens)
                factor = stage_factor(self._layers, self.pp, micro)
            t, h = -(-tokens // micro), -(-head_tokens // micro)
            gemm, elementwise, comm = times.layers_us(t)
            gemm = factor * gemm + times.gemm_us((times.head,), h)
            elementwise *= factor
            comm *= factor
            if self.pp > 1:
                comm += (self.pp - 1) * times.transfer_us(t)
            cover = gemm + elementwise + comm
            overhead = self._overhead + self.cpu.waited_us(tokens, head_tokens, cover)
            parts = (gemm, elementwise, comm, overhead, self._layers * factor / micro)
        else:
            parts = (0.0, 0.0, 0.0, self._overhead + self.cpu.waited_us(0, 0, 0.0), self._layers)
        if len(self._dense_memo) >= DENSE_MEMO:
            self._dense_memo.clear()
        self._dense_memo[key] = parts
        return parts

    def _parts(
        self,
        dense: tuple[Any, ...],
        prefill_tokens: Any,
        decode_requests: Any,
        decode_context_tokens: Any,
        prefill_context_tokens: Any,
        prefill_attention_pairs: Any,
        loaded_tokens: Any,
        maximum: Any = None,
        minimum: Any = None,
    ) -> tuple[Any, Any, Any]:
        """``(time_us, attention, load)`` from the dense parts (:meth:`_dense`) and the
        iteration's arguments: the one place the attention, the load and the time's sum are
        written (the module docstring), for numbers and, element-wise, numpy arrays.
        ``maximum`` and ``minimum`` pick the larger / smaller of two terms: None for numbers
        (inline), ``numpy.maximum`` / ``numpy.minimum`` for arrays, or (``maximum``) a
        function returning one of its two arguments (a stretch's branches,
        :meth:`stretch`)."""
        if self._simple:
            flops_us = self._pair_us * prefill_attention_pairs
            kv_us = self._context_us * prefill_context_tokens
            decode_us = self._decode_us * decode_context_tokens
        else:
            pairs, context, decode = (
                prefill_attention_pairs,
                prefill_context_tokens,
                decode_context_tokens,
            )
            t = self.times
            main_pairs, main_decode = pairs, decode
            if self._sparse:
                topk = self._topk
                cap_pairs, cap_decode = prefill_tokens * topk, decode_requests * topk
                if minimum is None:
                    main_pairs = pairs if pairs < cap_pairs else cap_pairs
                    main_decode = decode if decode < cap_decode else cap_decode
                else:
                    main_pairs, main_decode = minimum(pairs, cap_pairs), minimum(decode, cap_decode)
            prefix = context - prefill_tokens
            flops_us = t.pair_us * main_pairs + t.prefix_us * prefix + t.index_pair_us * pairs
            kv_us = (t.context_us + t.index_context_us) * context
            decode_us = t.decode_us * main_decode + t.index_decode_us * decode
        if maximum is None:
            prefill = flops_us if flops_us > kv_us else kv_us
        else:
            prefill = maximum(flops_us, kv_us)
        gemm, elementwise, communication, overhead, layers = dense
        attention = layers * (prefill + decode_us)
        load = self._load_token_us * loaded_tokens
        time_us = gemm + elementwise + attention + communication + load + overhead
        return time_us, attention, load

    def _flops(
        self, tokens: Any, head_tokens: Any, prefill_tokens: Any, decode_requests: Any,
        decode_context: Any, prefill_context: Any, pairs: Any, minimum: Any,
    ) -> Any:  # fmt: skip
        """The model FLOPs of all GPUs when ``tokens`` is not 0 (the caller's to zero)."""
        prefill_pair, decode_pair, prefix_token, index_pair = self._flops_units
        flops = self._flops_token * tokens + self._flops_head * head_tokens
        if self._simple:
            return flops + prefill_pair * pairs + decode_pair * decode_context
        main_pairs, main_decode = pairs, decode_context
        if self._sparse:
            main_pairs = minimum(pairs, prefill_tokens * self._topk)
            main_decode = minimum(decode_context, decode_requests * self._topk)
        prefix = prefill_context - prefill_tokens
        return (
            flops + prefill_pair * main_pairs + decode_pair * main_decode
            + prefix_token * prefix + index_pair * (pairs + decode_context)
        )  # fmt: skip

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
        dense = self._dense(tokens, head_tokens)
        gemm, elementwise, comm, overhead, _ = dense
        time_us, attention, load = self._parts(
            dense, prefill_tokens, decode_requests, decode_context_tokens,
            prefill_context_tokens, prefill_attention_pairs, loaded_tokens,
        )  # fmt: skip
        flops = (
            self._flops(
                tokens,
                head_tokens,
                prefill_tokens,
                decode_requests,
                decode_context_tokens,
                prefill_context_tokens,
                prefill_attention_pairs,
                min,
            )  # fmt: skip
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
            dense, prefill_tokens, decode_requests, decode_context_tokens,
            prefill_context_tokens, prefill_attention_pairs, loaded_tokens,
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
        the communication without tensor or pipeline parallelism), float for float: the parts
        fixed by the token counts once per distinct ``(tokens, head tokens)``, the rest
        element-wise by the same formula (:meth:`_parts`)."""
        import numpy as np

        tokens = prefill_tokens + decode_requests
        head_tokens = decode_requests + (prefill_tokens != 0)
        gemm, elementwise, comm, overhead, layers = self._dense_many(tokens, head_tokens)
        if self.tp <= 1 and self.pp <= 1:
            comm = 0.0  # (every iteration's: no collective on one GPU)
        time_us, attention, load = self._parts(
            (gemm, elementwise, comm, overhead, layers), prefill_tokens, decode_requests,
            decode_context_tokens, prefill_context_tokens, prefill_attention_pairs,
            loaded_tokens, np.maximum, np.minimum,  # (no NaN here)
        )  # fmt: skip
        flops = self._flops(
            tokens, head_tokens, prefill_tokens, decode_requests, decode_context_tokens,
            prefill_context_tokens, prefill_attention_pairs, np.minimum,
        )  # fmt: skip
        flops = np.asarray(flops, dtype=float)
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
    ) -> AffinePieces | Looped:
        """The durations of a stretch (:mod:`cpkv.serving.cost.stretch`; the decode context
        grows by ``decode_context_step``, default ``decode_requests``, a step): the token
        count is fixed, so the dense parts and the overhead are constant, decode attention
        is affine in the step, load is 0, and prefill attention is the larger of two
        affine terms (the FLOPs of the pairs and of the prefixes' up-projection, and the
        contexts' reads). :meth:`_parts` is linear in the contexts and pairs for a chosen
        term: its constant (no attention, no load; remembered by token counts) and its
        rates per decode context token, per pair, per prefix token and per prefill context
        token give each term's line; one piece when the same term is the larger throughout,
        else two, split at their crossing. With sparse attention the caps on pairs and
        contexts bend the durations: the stretch is looped over, iteration by iteration."""
        step = decode_requests if decode_context_step is None else decode_context_step
        args = (
            prefill_tokens, decode_requests, decode_context_tokens, prefill_context_tokens,
            prefill_attention_pairs, prefill_context_step, prefill_attention_pairs_step,
        )  # fmt: skip
        if self._sparse:
            return Looped(self, args, step)
        constant, layers = self._stretch_constant(prefill_tokens, decode_requests)
        decode_rate, pair_rate = layers * self._decode_us, layers * self._pair_us
        prefix_rate, kv_rate = layers * self._prefix_us, layers * self._context_us
        prefix = prefill_context_tokens - prefill_tokens
        base = constant + decode_rate * decode_context_tokens
        slope = decode_rate * step
        a_flops = base + pair_rate * prefill_attention_pairs + prefix_rate * prefix
        a_kv = base + kv_rate * prefill_context_tokens
        b_flops = (
            slope + pair_rate * prefill_attention_pairs_step + prefix_rate * prefill_context_step
        )
        b_kv = slope + kv_rate * prefill_context_step
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

    def _stretch_constant(self, prefill_tokens: int, decode_requests: int) -> tuple[float, float]:
        """A stretch's time with no attention and no load, and its attention's layers
        (remembered by token counts)."""
        key = (prefill_tokens, decode_requests)
        known = self._stretch_constants.get(key)
        if known is None:
            if len(self._stretch_constants) >= DENSE_MEMO:
                self._stretch_constants.clear()
            dense = self._dense(
                prefill_tokens + decode_requests, decode_requests + (1 if prefill_tokens else 0)
            )
            known = self._parts(dense, 0, 0, 0, 0, 0, 0)[0], dense[4]
            self._stretch_constants[key] = known
        return known

    def _dense_many(self, tokens: Any, head_tokens: Any) -> tuple[Any, ...]:
        """:meth:`_dense` of each ``(tokens, head tokens)`` pair, as five arrays: computed
        once per distinct pair (runs of equal pairs, as decode stretches log them, first
        taken as one)."""
        import numpy as np

        n = len(tokens)
        if not n:
            return tuple(np.zeros(0) for _ in range(DENSE_PARTS))
        if int(tokens.max()) >= 1 << 31 or int(head_tokens.max()) >= 1 << 32:  # not one key
            pairs = list(zip(tokens.tolist(), head_tokens.tolist(), strict=True))
            dense = np.array([self._dense(t, h) for t, h in pairs], dtype=float).reshape(
                -1, DENSE_PARTS
            )
            return tuple(dense[:, j] for j in range(DENSE_PARTS))
        key = np.left_shift(np.asarray(tokens, dtype=np.int64), 32)
        key |= np.asarray(head_tokens, dtype=np.int64)
        heads = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        keys, where = np.unique(key[heads], return_inverse=True)
        dense = self._dense_of(keys)
        lengths = np.diff(np.append(heads, n))
        each = np.repeat(where.reshape(-1), lengths)  # each iteration's row of ``dense``
        return tuple(np.ascontiguousarray(dense[:, j])[each] for j in range(DENSE_PARTS))

    def _dense_of(self, keys: Any) -> Any:
        """:meth:`_dense` of each packed ``tokens << 32 | head tokens`` of ``keys`` (sorted,
        distinct), as a ``(len(keys), 5)`` array: those seen before (up to
        :data:`DENSE_MEMO`) looked up, the others computed and remembered."""
        import numpy as np

        known, parts = getattr(self, "_dense_known", None) or (
            np.zeros(0, np.int64),
            np.zeros((0, DENSE_PARTS)),
        )
        at = np.searchsorted(known, keys)
        found = at < len(known)
        found[found] = known[at[found]] == keys[found]
        if not found.all():
            new = keys[~found]
            computed = np.array(
                [self._dense(int(k >> 32), int(k & 0xFFFFFFFF)) for k in new.tolist()],
                dtype=float,
            ).reshape(-1, DENSE_PARTS)
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
            "pp": self.pp,
            "ep": self.ep,
            "allreduce": self.allreduce,
            "shape": {k: v for k, v in to_dict(self.shape).items() if k != "hf_id"},
            "gpu_spec": {k: v for k, v in to_dict(self.gpu).items() if k not in GPU_SPEC_LEFT_OUT},
            "calibration": to_dict(self.calibration),
            "cpu": to_dict(self.cpu),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            **({} if self.gemm_tflops is None else {"gemm_fp8_tflops": self.gemm_tflops}),
        }


def build_roofline(spec: CostSpec) -> Any:
    """The roofline model of an ``admit.cost`` block (``kind: roofline``); with ``cp.size`` >
    1 wrapped in the CP prefill's (:class:`~cpkv.serving.cost.cp.cost.CpRooflineCost`)."""
    from cpkv.serving.cost.gpus import resolve_gpu

    gpu = resolve_gpu(spec.gpu, spec.gpu_spec)
    calibration = spec.calibration.resolve(gpu.calibration_for(spec.tp))
    gemm_tflops = gpu.fp8_tflops if spec.quantization == "fp8" else None
    engine = spec.cpu.engine or "sglang"  # (CostSpec.build fills it from admit.engine)
    cpu = spec.cpu.resolve(engine, spec.pp)
    allreduce = spec.allreduce or ("nccl" if engine == "none" else engine)
    model = RooflineCost(
        spec.shape(), gpu, spec.tp, calibration, (spec.model, spec.gpu), gemm_tflops, cpu,
        pp=spec.pp, ep=spec.ep, allreduce=allreduce,
    )  # fmt: skip
    if spec.cp.size > 1:
        from cpkv.serving.cost.cp.cost import build_cp

        return build_cp(model, spec)
    return model


def mfu_pct(flops: float, seconds: float, peak_flops_per_us: float | None) -> float | None:
    """Model FLOPs utilisation in percent: ``flops`` over ``seconds`` at the model's peak."""
    if peak_flops_per_us is None or seconds <= 0 or not math.isfinite(seconds):
        return None
    return 100.0 * flops / (seconds * 1e6 * peak_flops_per_us)
