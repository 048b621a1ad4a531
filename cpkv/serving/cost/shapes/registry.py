"""The models ``admit.cost.model`` names: a registry of shapes.

Every number is the model's published Hugging Face ``config.json`` (the repository named in
``hf_id``): ``num_hidden_layers`` -> ``layers``, ``hidden_size`` -> ``hidden``,
``num_attention_heads`` -> ``heads``, ``num_key_value_heads`` -> ``kv_heads`` (absent: equal
to ``heads``), ``head_dim`` (absent: ``hidden_size / num_attention_heads``) -> ``head_dim``,
``intermediate_size`` -> ``mlp`` (the width of one MLP projection), SwiGLU (``hidden_act:
silu`` with gate and up projections) -> ``gated_mlp``, ``vocab_size`` -> ``vocab``; MLA:
``kv_lora_rank``, ``q_lora_rank``, ``qk_nope_head_dim`` -> ``head_dim``, ``qk_rope_head_dim``
-> ``rope_head_dim``, ``v_head_dim``, and the indexer's ``index_topk``, ``index_n_heads`` ->
``index_heads``, ``index_head_dim``; MoE: ``n_routed_experts`` / ``num_experts`` /
``num_local_experts`` -> ``experts``, ``num_experts_per_tok`` -> ``experts_per_token``,
``moe_intermediate_size`` (Mixtral: ``intermediate_size``) -> ``expert_mlp``,
``n_shared_experts`` -> ``shared_experts``, ``first_k_dense_replace`` -> ``dense_layers``.
Weights and KV are BF16 (2 bytes) unless the checkpoint says otherwise (DeepSeek-V3's weights
are FP8: ``quantization_config.quant_method: fp8``, 128x128 blocks).
"""

from __future__ import annotations

from dataclasses import replace

from cpkv.core.registry import Registry
from cpkv.serving.cost.shapes.shape import ModelShape

MODELS: Registry[ModelShape] = Registry("model")
"""Model shapes by name (``admit.cost.model``)."""

MODELS.register(
    "llama-2-7b",
    ModelShape(32, 4096, 32, 32, 128, 11008, True, 32000, hf_id="meta-llama/Llama-2-7b-hf"),
    help="Llama-2-7B: 32 layers, hidden 4096, 32 heads (no GQA), MLP 11008, vocab 32000",
)
MODELS.register(
    "llama-2-70b",
    ModelShape(80, 8192, 64, 8, 128, 28672, True, 32000, hf_id="meta-llama/Llama-2-70b-hf"),
    help="Llama-2-70B: 80 layers, hidden 8192, 64 heads, 8 KV heads, MLP 28672, vocab 32000",
)
MODELS.register(
    "llama-3-8b",
    ModelShape(32, 4096, 32, 8, 128, 14336, True, 128256, hf_id="meta-llama/Meta-Llama-3-8B"),
    help="Llama-3-8B: 32 layers, hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocab 128256",
)
MODELS.register(
    "llama-3-70b",
    ModelShape(80, 8192, 64, 8, 128, 28672, True, 128256, hf_id="meta-llama/Meta-Llama-3-70B"),
    help="Llama-3-70B: 80 layers, hidden 8192, 64 heads, 8 KV heads, MLP 28672, vocab 128256",
)
MODELS.register(
    "qwen-72b",
    # Qwen/Qwen-72B config.json: intermediate_size 49152 is the sum of the gate and up
    # projections (the model builds each with intermediate_size // 2 = 24576); no GQA
    # (kv_channels 128 x 64 heads for K and V); vocab_size 152064
    ModelShape(80, 8192, 64, 64, 128, 24576, True, 152064, hf_id="Qwen/Qwen-72B"),
    help="Qwen-72B: 80 layers, hidden 8192, 64 heads (no GQA), MLP 24576, vocab 152064",
)
MODELS.register(
    "codellama-34b",
    ModelShape(48, 8192, 64, 8, 128, 22016, True, 32000, hf_id="codellama/CodeLlama-34b-hf"),
    help="CodeLlama-34B: 48 layers, hidden 8192, 64 heads, 8 KV heads, MLP 22016, vocab 32000",
)

# deepseek-ai/DeepSeek-V3 config.json: 61 layers, hidden 7168, 128 heads, q_lora_rank 1536,
# kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, the first 3
# layers dense (intermediate_size 18432), then 256 routed experts of moe_intermediate_size
# 2048, 8 a token, 1 shared; vocab 129280; FP8 weights
DEEPSEEK_V3 = ModelShape(
    61, 7168, 128, 128, 128, 18432, True, 129280, param_bytes=1,
    hf_id="deepseek-ai/DeepSeek-V3", kv_lora_rank=512, q_lora_rank=1536, rope_head_dim=64,
    v_head_dim=128, experts=256, experts_per_token=8, expert_mlp=2048, shared_experts=1,
    dense_layers=3,
)  # fmt: skip
MODELS.register(
    "deepseek-v3",
    DEEPSEEK_V3,
    help="DeepSeek-V3 (671B, 37B active): MLA (KV latent 512 + rope 64), 256 experts top-8 "
    "+ 1 shared, 61 layers (3 dense), FP8 weights",
)
# deepseek-ai/DeepSeek-V3.2-Exp config.json: DeepSeek-V3's shape and DeepSeek Sparse
# Attention's lightning indexer, index_n_heads 64 of index_head_dim 128, index_topk 2048
DEEPSEEK_V3_2 = replace(
    DEEPSEEK_V3, hf_id="deepseek-ai/DeepSeek-V3.2-Exp", index_topk=2048, index_heads=64,
    index_head_dim=128,
)  # fmt: skip
MODELS.register(
    "deepseek-v3.2",
    DEEPSEEK_V3_2,
    help="DeepSeek-V3.2-Exp: DeepSeek-V3 with sparse attention (an indexer of 64 heads of "
    "128 picks 2048 tokens a query)",
)
# Qwen/Qwen3-30B-A3B config.json: every layer's MLP is 128 experts of moe_intermediate_size
# 768, 8 a token, no shared expert (decoder_sparse_step 1, mlp_only_layers []); head_dim 128
# (not hidden / heads); intermediate_size 6144 unused
QWEN3_30B = ModelShape(
    48, 2048, 32, 4, 128, 6144, True, 151936, hf_id="Qwen/Qwen3-30B-A3B",
    experts=128, experts_per_token=8, expert_mlp=768,
)  # fmt: skip
MODELS.register(
    "qwen3-30b-a3b",
    QWEN3_30B,
    help="Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads, 4 KV heads, 128 experts top-8 of 768",
)
# Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 64 heads, 4 KV heads of 128, 128
# experts of moe_intermediate_size 1536, 8 a token, no shared expert
QWEN3_235B = ModelShape(
    94, 4096, 64, 4, 128, 12288, True, 151936, hf_id="Qwen/Qwen3-235B-A22B",
    experts=128, experts_per_token=8, expert_mlp=1536,
)  # fmt: skip
MODELS.register(
    "qwen3-235b-a22b",
    QWEN3_235B,
    help="Qwen3-235B-A22B: 94 layers, hidden 4096, 64 heads, 4 KV heads, 128 experts top-8 of 1536",
)
# mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads,
# num_local_experts 8 of intermediate_size 14336, num_experts_per_tok 2, vocab 32000
MIXTRAL_8X7B = ModelShape(
    32, 4096, 32, 8, 128, 14336, True, 32000, hf_id="mistralai/Mixtral-8x7B-v0.1",
    experts=8, experts_per_token=2, expert_mlp=14336,
)  # fmt: skip
MODELS.register(
    "mixtral-8x7b",
    MIXTRAL_8X7B,
    help="Mixtral-8x7B: 32 layers, hidden 4096, 32 heads, 8 KV heads, 8 experts top-2 of 14336",
)
