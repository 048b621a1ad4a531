"""The interface every iteration-time model offers the serving loop, and the registry of kinds.

The loop describes one iteration (one forward pass) by six numbers and asks
``batch_us(prefill_tokens, decode_requests, decode_context_tokens, prefill_context_tokens,
prefill_attention_pairs, loaded_tokens)`` for its time in microseconds:

* ``prefill_tokens``: prompt tokens computed this iteration (every chunk of every request);
* ``decode_requests``: running requests that decode one token;
* ``decode_context_tokens``: the KV tokens those requests' attention reads (their whole
  contexts);
* ``prefill_context_tokens``: over the prefill chunks, tokens before the chunk + the chunk;
* ``prefill_attention_pairs``: the query-key pairs causal prefill attention computes: for a
  chunk of ``e`` tokens after ``p`` tokens, ``e * p + e * (e + 1) / 2``, summed over chunks;
* ``loaded_tokens``: L2 prefix hits loaded back to the device (L2 -> L1) this iteration.

``breakdown`` (same arguments) returns ``(time_us, *parts, flops)``: the time, the parts of
it named by :data:`PARTS` (microseconds each) and the model FLOPs of the iteration (0 when
the model does not know them). ``time_us`` equals ``batch_us`` float for float.

Optional, for speed (the serving loop checks what it uses against ``batch_us`` and
``breakdown``): ``breakdowns`` (the six arguments as integer numpy arrays of ``n``
iterations, the eight columns of the rows ``breakdown`` gives, float for float, each a
float array of ``n`` or one float when the same in every iteration: a streamed run breaks
its iterations down from their logged arguments with it) and ``stretch(prefill_tokens,
decode_requests, decode_context_tokens, prefill_context_tokens, prefill_attention_pairs,
prefill_context_step, prefill_attention_pairs_step)`` (the durations of iterations whose
arguments grow by constant steps, as piecewise affine functions of the step:
:mod:`cpkv.serving.cost.stretch`). A model that counts something per iteration it prices
(:class:`~cpkv.serving.cost.graph_padding.PaddedDecodeCost`) also offers
``stretch_ran(prefill_tokens, decode_requests, decode_context_tokens, steps, durations)``,
which the engine calls with the iterations it ran of a stretch.

``admit.cost.kind`` picks the model from :data:`COST_KINDS` (``roofline``, ``linear``): each
builder takes the ``admit.cost`` block (:class:`cpkv.serving.cost.spec.CostSpec`, which
imports this module: the builders are registered by name, never imported here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from cpkv.core.registry import Registry

PARTS = ("gemm", "elementwise", "attention", "communication", "load", "overhead")
"""Where an iteration's time goes: linear layers (GEMMs, the LM head included), the other
per-layer kernels (norms, rotary embedding, activation, residual adds), attention, tensor-
parallel collectives (all-reduce, all-to-all, pipeline transfers), L2 -> L1 load-back, and the
overhead (the engine's CPU work the GPU waits for, :mod:`cpkv.serving.cost.cpu`)."""


class IterationCost(Protocol):
    """What the serving loop and its reports use of a cost model."""

    kind: str
    kv_bytes_per_token: int  # KV bytes of one token, all layers (recompute bytes, load-back)
    peak_flops_per_us: float | None  # FLOPs per microsecond of all its GPUs at peak (MFU)

    def batch_us(
        self,
        prefill_tokens: int,
        decode_requests: int,
        decode_context_tokens: int,
        prefill_context_tokens: int,
        prefill_attention_pairs: int,
        loaded_tokens: int,
    ) -> float: ...

    def breakdown(
        self,
        prefill_tokens: int,
        decode_requests: int,
        decode_context_tokens: int,
        prefill_context_tokens: int,
        prefill_attention_pairs: int,
        loaded_tokens: int,
    ) -> tuple[float, ...]: ...

    def describe(self) -> dict[str, Any]: ...


COST_KINDS: Registry[Callable[[Any], IterationCost]] = Registry("cost model kind")
"""Builders by ``admit.cost.kind``: the config block (a ``CostSpec``) -> the model the loop
calls."""

COST_KINDS.register(
    "roofline",
    "cpkv.serving.cost.roofline:build_roofline",
    help="from the model's shape and the GPU: GEMMs, attention, all-reduce, load-back, overhead",
)
COST_KINDS.register(
    "linear",
    "cpkv.serving.cost.model:build_linear",
    help="fixed + per prefill token + per decoding request + per context token + load-back",
)
