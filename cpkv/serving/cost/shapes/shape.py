"""A model's shape (``admit.cost.model_shape``): its sizes, their bounds, and the rules that
make a shape possible.

Three families share one dataclass, told apart by which sizes are non-zero:

* **dense attention** (GQA/MHA): ``heads`` query heads and ``kv_heads`` KV heads of
  ``head_dim``; the KV cache holds K and V of every KV head;
* **MLA** (multi-head latent attention, DeepSeek-V2/V3) when ``kv_lora_rank`` > 0: the KV
  cache holds one compressed latent of ``kv_lora_rank`` plus a shared rotary key of
  ``rope_head_dim`` per token and layer; queries come through a low-rank ``q_lora_rank``
  (0: projected directly); ``head_dim`` is the non-rotary query/key head
  (``qk_nope_head_dim``), ``v_head_dim`` the value head; with ``index_topk`` > 0 (DeepSeek
  Sparse Attention, V3.2) a lightning indexer of ``index_heads`` heads of
  ``index_head_dim`` scores the context and each query attends to its ``index_topk`` best
  tokens;
* **MoE** when ``experts`` > 0: after the first ``dense_layers`` layers (a dense MLP of
  ``mlp``), every layer's MLP is a router over ``experts`` routed experts of width
  ``expert_mlp``, each token going to ``experts_per_token`` of them, plus
  ``shared_experts`` experts every token goes through.

Each size is bounded (:data:`SIZE_BOUNDS`: several times the largest any published model has,
so that a typo of a few digits is refused) and a shape must hang together
(:func:`shape_problem`): KV heads at most the attention heads and a divisor of them (each KV
head serves a whole group of query heads), the tensor-parallel degree a divisor of the heads,
and either a divisor or a multiple of the KV heads (they are split evenly over the GPUs, or
replicated; an MLA latent is replicated on every GPU); a size of one family set on a model
of another is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Annotated, Any

from cpkv.core.errors import ConfigError
from cpkv.core.schema import FieldError, Range, require

SIZE_BOUNDS = {
    "layers": Range(1, 1024, why="8x the deepest published model, 126 layers"),
    "hidden": Range(1, 131072, why="8x the widest published model, hidden 16384"),
    "heads": Range(1, 1024, why="8x the most attention heads of a published model, 128"),
    "kv_heads": Range(1, 1024, why="8x the most attention heads of a published model, 128"),
    "head_dim": Range(1, 2048, why="8x the largest published head, 256"),
    "mlp": Range(1, 1 << 20, why="14x the widest published MLP, 73728"),
    "vocab": Range(1, 1 << 22, why="16x the largest published vocabulary, 256000"),
    "param_bytes": Range(1, 8, why="1 (FP8) to 8 (FP64) bytes per weight"),
    "kv_bytes": Range(1, 8, why="1 (FP8) to 8 (FP64) bytes per KV element"),
    "kv_lora_rank": Range(0, 8192, why="16x DeepSeek-V3's KV latent, 512"),
    "q_lora_rank": Range(0, 32768, why="16x DeepSeek-V3's query latent, 1536"),
    "rope_head_dim": Range(0, 2048, why="8x the largest published head, 256"),
    "v_head_dim": Range(0, 2048, why="8x the largest published head, 256"),
    "index_topk": Range(0, 1 << 20, why="512x DeepSeek-V3.2's 2048 tokens a query"),
    "index_heads": Range(0, 1024, why="16x DeepSeek-V3.2's 64 indexer heads"),
    "index_head_dim": Range(0, 2048, why="16x DeepSeek-V3.2's indexer head, 128"),
    "experts": Range(0, 8192, why="16x the most routed experts of a published model, 512"),
    "experts_per_token": Range(0, 1024, why="32x the most experts a token visits, 10"),
    "expert_mlp": Range(0, 1 << 20, why="14x the widest published MLP, 73728"),
    "shared_experts": Range(0, 1024, why="128x the most shared experts of a published model"),
    "dense_layers": Range(0, 1024, why="the layers of the deepest shape allowed"),
}
"""The bounds of each size of a model shape."""
MLA_SIZES = ("q_lora_rank", "rope_head_dim", "v_head_dim", "index_topk", "index_heads",
             "index_head_dim")  # fmt: skip
INDEX_SIZES = ("index_topk", "index_heads", "index_head_dim")
MOE_SIZES = ("experts_per_token", "expert_mlp", "shared_experts", "dense_layers")
DENSE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "mlp", "gated_mlp", "vocab")
"""The sizes every shape gives (the others default to 0: no MLA, no experts)."""
INDEX_KEY_SCALE_BYTES = 4
"""An FP32 scale stored beside each token's FP8 indexer key (vLLM's and SGLang's indexer
cache: ``index_head_dim + index_head_dim / 128 * 4`` bytes a token and layer)."""
MAX_TP = 1024


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer (all per model, before any parallelism; see
    the module docstring for the three families)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    gated_mlp: bool
    vocab: int
    param_bytes: int = 2
    kv_bytes: int = 2
    hf_id: str = ""
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0
    index_topk: int = 0
    index_heads: int = 0
    index_head_dim: int = 0
    experts: int = 0
    experts_per_token: int = 0
    expert_mlp: int = 0
    shared_experts: int = 0
    dense_layers: int = 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is the experts (0 for a dense model)."""
        return self.layers - self.dense_layers if self.moe else 0

    def kv_layer_bytes(self) -> int:
        """KV cache bytes of one token in one layer, all heads: K and V of every KV head, or
        an MLA latent and its rotary key (plus the indexer's FP8 key and its scale)."""
        if not self.mla:
            return 2 * self.kv_heads * self.head_dim * self.kv_bytes
        latent = (self.kv_lora_rank + self.rope_head_dim) * self.kv_bytes
        if self.index_topk:
            latent += self.index_head_dim + INDEX_KEY_SCALE_BYTES * -(-self.index_head_dim // 128)
        return latent

    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one token, all layers."""
        return self.layers * self.kv_layer_bytes()


def _size(name: str) -> Any:
    return Annotated[int, SIZE_BOUNDS[name]] | None


@dataclass(frozen=True)
class ShapeOverrides:
    """``admit.cost.model_shape``: sizes that replace the named model's (null: keep it)."""

    layers: _size("layers") = None
    hidden: _size("hidden") = None
    heads: _size("heads") = None
    kv_heads: _size("kv_heads") = None
    head_dim: _size("head_dim") = None
    mlp: _size("mlp") = None
    gated_mlp: bool | None = None
    vocab: _size("vocab") = None
    param_bytes: _size("param_bytes") = None
    kv_bytes: _size("kv_bytes") = None
    kv_lora_rank: _size("kv_lora_rank") = None
    q_lora_rank: _size("q_lora_rank") = None
    rope_head_dim: _size("rope_head_dim") = None
    v_head_dim: _size("v_head_dim") = None
    index_topk: _size("index_topk") = None
    index_heads: _size("index_heads") = None
    index_head_dim: _size("index_head_dim") = None
    experts: _size("experts") = None
    experts_per_token: _size("experts_per_token") = None
    expert_mlp: _size("expert_mlp") = None
    shared_experts: _size("shared_experts") = None
    dense_layers: _size("dense_layers") = None

    def given(self) -> dict[str, Any]:
        """The fields set (not null)."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }


def shape_problem(shape: ModelShape, tp: int = 1) -> tuple[str, str] | None:
    """``(field, why)`` for the first thing that makes ``shape`` impossible on ``tp`` GPUs
    (a size out of :data:`SIZE_BOUNDS`, heads that do not divide, a size of another family;
    see the module docstring), or None. ``field`` is a ModelShape field, or ``tp``."""
    for name, bound in SIZE_BOUNDS.items():
        value = getattr(shape, name)
        problem = bound.problem(value)
        if problem is not None:
            return name, f"{problem}, got {value}"
    problem = _attention_problem(shape) or _moe_problem(shape)
    if problem is not None:
        return problem
    heads, kv = shape.heads, shape.kv_heads
    if heads % tp:
        return "tp", f"must divide the model's {heads} attention heads, got {tp}"
    if not shape.mla and kv % tp and tp % kv:
        return "tp", (
            f"must divide the model's {kv} KV heads or be a multiple of them (KV heads are split "
            f"evenly over the GPUs or replicated), got {tp}"
        )
    return None


def _attention_problem(shape: ModelShape) -> tuple[str, str] | None:
    heads, kv = shape.heads, shape.kv_heads
    if kv > heads:
        return "kv_heads", f"must be at most the {heads} attention heads, got {kv}"
    if heads % kv:
        return "kv_heads", (
            f"must divide the {heads} attention heads (each KV head serves a whole group of "
            f"query heads), got {kv}"
        )
    if not shape.mla:
        for name in MLA_SIZES:
            if getattr(shape, name):
                return name, (
                    f"is a size of multi-head latent attention and this model has no KV latent "
                    f"(kv_lora_rank 0); allowed: 0, or set kv_lora_rank, got {getattr(shape, name)}"
                )
        return None
    given = [bool(getattr(shape, name)) for name in INDEX_SIZES]
    if any(given) and not all(given):
        name = INDEX_SIZES[given.index(False)]
        return name, (
            "the sparse-attention indexer needs index_topk, index_heads and index_head_dim "
            f"all set, got {name} 0"
        )
    return None


def _moe_problem(shape: ModelShape) -> tuple[str, str] | None:
    if not shape.moe:
        for name in MOE_SIZES:
            if getattr(shape, name):
                return name, (
                    f"is a size of a mixture of experts and this model has none (experts 0); "
                    f"allowed: 0, or set experts, got {getattr(shape, name)}"
                )
        return None
    if not 1 <= shape.experts_per_token <= shape.experts:
        return "experts_per_token", (
            f"must be 1 to the model's {shape.experts} experts, got {shape.experts_per_token}"
        )
    if shape.expert_mlp < 1:
        return "expert_mlp", "must be >= 1 for a model with experts, got 0"
    if shape.dense_layers >= shape.layers:
        return "dense_layers", (
            f"must be below the model's {shape.layers} layers (at least one layer of experts), "
            f"got {shape.dense_layers}"
        )
    return None


def resolve_shape(name: str | None, overrides: Any) -> ModelShape:
    """The named model with ``overrides`` applied; without a name every size of
    :data:`DENSE_FIELDS` must be given. FieldError (keys relative to ``admit.cost``) for an
    unknown name or a missing field."""
    from cpkv.serving.cost.shapes.registry import MODELS

    given = overrides.given()
    if name is None:
        needed = [n for n in DENSE_FIELDS if n not in given]
        require(
            not needed,
            "model_shape",
            f"model is null, so model_shape must give every size; missing: {', '.join(needed)} "
            f"(or name a model: {', '.join(MODELS.names())})",
        )
        return ModelShape(**given)
    try:
        shape = MODELS.get(name)
    except ConfigError as err:  # an unknown name, with its did-you-mean
        raise FieldError("model", str(err)) from None
    return replace(shape, **given)
