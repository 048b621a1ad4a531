"""Model shapes for the roofline cost model (``admit.cost.model``): a registry by name.

Every number is the model's published Hugging Face ``config.json`` (the repository named in
``hf_id``): ``num_hidden_layers`` -> ``layers``, ``hidden_size`` -> ``hidden``,
``num_attention_heads`` -> ``heads``, ``num_key_value_heads`` -> ``kv_heads`` (absent: equal
to ``heads``), ``hidden_size / num_attention_heads`` -> ``head_dim``, ``intermediate_size``
-> ``mlp`` (the width of one MLP projection), SwiGLU (``hidden_act: silu`` with gate and up
projections) -> ``gated_mlp``, ``vocab_size`` -> ``vocab``. Weights and KV are BF16 (2 bytes)
unless a config says otherwise.

``admit.cost.model_shape`` overrides any field of the named model, or, with
``admit.cost.model: null``, gives them all (a model not in the registry). Each size is
bounded (:data:`SIZE_BOUNDS`: several times the largest any published model has, so that a
typo of a few digits is refused) and a shape must hang together (:func:`shape_problem`):
KV heads at most the attention heads and a divisor of them (each KV head serves a whole
group of query heads), the tensor-parallel degree a divisor of the heads, and either a
divisor or a multiple of the KV heads (they are split evenly over the GPUs, or replicated).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Annotated, Any

from cpkv.core.errors import ConfigError
from cpkv.core.registry import Registry
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
}
"""The bounds of each size of a model shape."""
MAX_TP = 1024


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a dense decoder-only transformer (all per model, before tensor parallelism)."""

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

    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one token, all layers: K and V, ``kv_heads x head_dim`` each."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes

    def params(self) -> int:
        """Weights of the linear layers and the LM head (embeddings and norms left out)."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        out = self.heads * self.head_dim * self.hidden
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.mlp
        return self.layers * (qkv + out + mlp) + self.hidden * self.vocab


@dataclass(frozen=True)
class ShapeOverrides:
    """``admit.cost.model_shape``: fields that replace the named model's (null: keep it)."""

    layers: Annotated[int, SIZE_BOUNDS["layers"]] | None = None
    hidden: Annotated[int, SIZE_BOUNDS["hidden"]] | None = None
    heads: Annotated[int, SIZE_BOUNDS["heads"]] | None = None
    kv_heads: Annotated[int, SIZE_BOUNDS["kv_heads"]] | None = None
    head_dim: Annotated[int, SIZE_BOUNDS["head_dim"]] | None = None
    mlp: Annotated[int, SIZE_BOUNDS["mlp"]] | None = None
    gated_mlp: bool | None = None
    vocab: Annotated[int, SIZE_BOUNDS["vocab"]] | None = None
    param_bytes: Annotated[int, SIZE_BOUNDS["param_bytes"]] | None = None
    kv_bytes: Annotated[int, SIZE_BOUNDS["kv_bytes"]] | None = None

    def given(self) -> dict[str, Any]:
        """The fields set (not null)."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }


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


def shape_problem(shape: ModelShape, tp: int = 1) -> tuple[str, str] | None:
    """``(field, why)`` for the first thing that makes ``shape`` impossible on ``tp`` GPUs
    (a size out of :data:`SIZE_BOUNDS`, heads that do not divide; see the module
    docstring), or None. ``field`` is a ModelShape field, or ``tp``."""
    for name, bound in SIZE_BOUNDS.items():
        value = getattr(shape, name)
        problem = bound.problem(value)
        if problem is not None:
            return name, f"{problem}, got {value}"
    heads, kv = shape.heads, shape.kv_heads
    if kv > heads:
        return "kv_heads", f"must be at most the {heads} attention heads, got {kv}"
    if heads % kv:
        return "kv_heads", (
            f"must divide the {heads} attention heads (each KV head serves a whole group of "
            f"query heads), got {kv}"
        )
    if heads % tp:
        return "tp", f"must divide the model's {heads} attention heads, got {tp}"
    if kv % tp and tp % kv:
        return "tp", (
            f"must divide the model's {kv} KV heads or be a multiple of them (KV heads are split "
            f"evenly over the GPUs or replicated), got {tp}"
        )
    return None


def resolve_shape(name: str | None, overrides: ShapeOverrides) -> ModelShape:
    """The named model with ``overrides`` applied; without a name every field must be given.
    FieldError (keys relative to ``admit.cost``) for an unknown name or a missing field."""
    given = overrides.given()
    if name is None:
        needed = [f.name for f in fields(ShapeOverrides) if f.name not in given]
        needed = [n for n in needed if n not in ("param_bytes", "kv_bytes")]
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
