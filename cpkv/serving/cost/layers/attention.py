"""The attention kernel's work in one layer on one GPU of ``tp``, per unit of the cost model's
arguments (a prefill attention pair, a cached prefix token, a context token read).

* **grouped-query** (``heads/tp`` query heads of ``head_dim``): a causal pair costs
  ``4·head_dim`` FLOPs a head (QKᵀ and PV), prefill or decode; a context token read costs
  its K and V, ``2·kv_heads/tp·head_dim·kv_bytes`` (KV heads replicated when fewer than
  ``tp``);
* **latent (MLA)**: every GPU holds the whole latent (``kv_lora_rank + rope_head_dim``
  elements a token: the cache is not split by heads). Prefill attends in the expanded form
  (vLLM's and SGLang's MLA prefill): a pair costs ``2·(head_dim + rope_head_dim) +
  2·v_head_dim`` FLOPs a head, and the cached prefix's latents are first up-projected to keys
  and values, ``2·kv_lora_rank·heads/tp·(head_dim + v_head_dim)`` FLOPs a prefix token (the
  chunk's own tokens go through that GEMM with the iteration's). Decode attends in the
  absorbed form (FlashMLA's): the query is multiplied into latent space, so a pair costs
  ``2·(kv_lora_rank + rope_head_dim) + 2·kv_lora_rank`` FLOPs a head, over the latent;
* **sparse (DeepSeek Sparse Attention)**: the indexer scores every causal pair with
  ``index_heads`` heads of ``index_head_dim`` (``2·index_heads·index_head_dim`` FLOPs, on
  every GPU) reading each context token's FP8 key and scale; each query then attends to at
  most ``index_topk`` tokens (``topk``; the roofline model caps the iteration's pairs and
  decode contexts with it).
"""

from __future__ import annotations

from dataclasses import dataclass

from cpkv.serving.cost.shapes import ModelShape
from cpkv.serving.cost.shapes.shape import INDEX_KEY_SCALE_BYTES


@dataclass(frozen=True)
class AttentionWork:
    """One layer's attention work on one GPU (module docstring): FLOPs of a prefill pair, of
    a decode pair (one context token of a decoding request), of a cached prefix token (the
    latent's up-projection), bytes of a context token's cache read, and the indexer's FLOPs
    a pair and bytes a context token (0 without sparse attention); ``topk`` the tokens a
    query attends to at most (0: all)."""

    prefill_pair_flops: float
    decode_pair_flops: float
    prefix_token_flops: float
    context_token_bytes: float
    index_pair_flops: float
    index_token_bytes: float
    topk: int


def attention_work(shape: ModelShape, tp: int) -> AttentionWork:
    """The attention work of ``shape`` on one GPU of ``tp`` (module docstring)."""
    heads = shape.heads // tp
    if not shape.mla:
        kv_heads = -(-shape.kv_heads // tp)
        pair = 4.0 * shape.head_dim * heads
        kv = 2 * kv_heads * shape.head_dim * shape.kv_bytes
        return AttentionWork(pair, pair, 0.0, kv, 0.0, 0.0, 0)
    rank, rope = shape.kv_lora_rank, shape.rope_head_dim
    v = shape.v_head_dim or shape.head_dim
    prefill = 2.0 * (shape.head_dim + rope) * heads + 2.0 * v * heads
    decode = 2.0 * (rank + rope) * heads + 2.0 * rank * heads
    prefix = 2.0 * rank * heads * (shape.head_dim + v)
    latent = (rank + rope) * shape.kv_bytes
    if not shape.index_topk:
        return AttentionWork(prefill, decode, prefix, latent, 0.0, 0.0, 0)
    index_flops = 2.0 * shape.index_heads * shape.index_head_dim
    index_bytes = shape.index_head_dim + INDEX_KEY_SCALE_BYTES * -(-shape.index_head_dim // 128)
    return AttentionWork(
        prefill, decode, prefix, latent, index_flops, index_bytes, shape.index_topk
    )
