"""One layer's GEMMs other than the routed experts, and its elementwise kernels' bytes, on one
GPU of ``tp`` (each ``(K, N)``: a ``T x K`` activation times a ``K x N`` weight).

* attention projections — grouped-query: QKV ``(hidden, (heads + 2·kv_heads)/tp · head_dim)``
  and output ``(heads/tp · head_dim, hidden)`` (KV heads replicated when fewer than ``tp``);
  latent (MLA): the query down-projection ``(hidden, q_lora_rank)`` and the KV one
  ``(hidden, kv_lora_rank + rope_head_dim)`` on every GPU (replicated, as vLLM and SGLang
  run them), the query up-projection ``(q_lora_rank, heads/tp · (head_dim +
  rope_head_dim))`` (or ``(hidden, ...)`` without ``q_lora_rank``), the KV up-projection
  ``(kv_lora_rank, heads/tp · (head_dim + v_head_dim))`` (absorbed into the query and the
  output when decoding: the same weights and FLOPs a token) and the output ``(heads/tp ·
  v_head_dim, hidden)``; the sparse-attention indexer adds its query ``(q_lora_rank,
  index_heads · index_head_dim)``, key ``(hidden, index_head_dim)`` and head weights
  ``(hidden, index_heads)``, on every GPU;
* the dense MLP — gate+up ``(hidden, 2·mlp/tp)`` (one projection without a gate) and down
  ``(mlp/tp, hidden)``.

Elementwise kernels (per token, bytes read and written, BF16): two RMSNorms of ``hidden``
(read and write) and, with MLA, the norms of the query and KV latents; rotary embedding of
the queries and keys that carry it (read and write); the MLP activation (gated: read two,
write one of its width); the residual add (read two, write one ``hidden``).
"""

from __future__ import annotations

from cpkv.serving.cost.shapes import ModelShape

ACTIVATION_BYTES = 2  # BF16 activations
Gemm = tuple[int, int]


def attention_gemms(shape: ModelShape, tp: int) -> tuple[Gemm, ...]:
    """The attention projections' ``(K, N)`` on one GPU (module docstring)."""
    h, heads = shape.hidden, shape.heads // tp
    if not shape.mla:
        kv_heads = -(-shape.kv_heads // tp)
        d = shape.head_dim
        return ((h, (heads + 2 * kv_heads) * d), (heads * d, h))
    nope, rope, v = shape.head_dim, shape.rope_head_dim, shape.v_head_dim or shape.head_dim
    q_in = shape.q_lora_rank or h
    gemms: list[Gemm] = []
    if shape.q_lora_rank:
        gemms.append((h, shape.q_lora_rank))
    gemms += [
        (h, shape.kv_lora_rank + rope),
        (q_in, heads * (nope + rope)),
        (shape.kv_lora_rank, heads * (nope + v)),
        (heads * v, h),
    ]
    if shape.index_topk:
        gemms += [
            (q_in, shape.index_heads * shape.index_head_dim),
            (h, shape.index_head_dim),
            (h, shape.index_heads),
        ]
    return tuple(gemms)


def mlp_gemms(hidden: int, width: int, gated: bool, tp: int) -> tuple[Gemm, ...]:
    """A (dense or shared-expert) MLP of ``width`` split over ``tp`` GPUs: gate+up, down."""
    part = -(-width // tp)
    return ((hidden, (2 if gated else 1) * part), (part, hidden))


def layer_gemms(shape: ModelShape, tp: int) -> tuple[Gemm, ...]:
    """A dense layer's GEMMs on one GPU: the attention projections, then the MLP's two (for
    a grouped-query model, the four that Vidur's profiles time: QKV, output, gate+up, down)."""
    return attention_gemms(shape, tp) + mlp_gemms(shape.hidden, shape.mlp, shape.gated_mlp, tp)


def elementwise_bytes_per_token(shape: ModelShape, tp: int, mlp_width: int | None = None) -> int:
    """Bytes one token reads and writes in one layer's elementwise kernels on one GPU
    (module docstring); ``mlp_width``: the activation's width on this GPU when it is not the
    dense MLP's (a layer of experts: the token's experts' widths)."""
    heads = shape.heads // tp
    if shape.mla:
        norms = 2 * 2 * shape.hidden + 2 * (shape.q_lora_rank + shape.kv_lora_rank)
        rotary = 2 * (heads + 1) * shape.rope_head_dim
    else:
        kv_heads = -(-shape.kv_heads // tp)
        norms = 2 * 2 * shape.hidden
        rotary = 2 * (heads + kv_heads) * shape.head_dim
    width = -(-shape.mlp // tp) if mlp_width is None else mlp_width
    act = (3 if shape.gated_mlp else 2) * width
    return (norms + rotary + act + 3 * shape.hidden) * ACTIVATION_BYTES
