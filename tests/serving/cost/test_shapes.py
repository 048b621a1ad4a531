"""The experts' and latent-attention models of the registry against their published configs,
their KV bytes by hand, and the refusals of sizes, ``pp`` and ``ep`` that do not fit the model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpkv.core.config import load_config
from cpkv.core.errors import ConfigError
from cpkv.serving.cost.roofline import active_params
from cpkv.serving.cost.shapes import MODELS, shape_problem

# (name, layers, hidden, heads, kv heads, experts, top-k, expert width, shared, dense layers)
# as their config.json files give them (docs/cost-model.md cites each)
CONFIGS = [
    ("deepseek-v3", 61, 7168, 128, 128, 256, 8, 2048, 1, 3),
    ("deepseek-v3.2", 61, 7168, 128, 128, 256, 8, 2048, 1, 3),
    ("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 8, 768, 0, 0),
    ("qwen3-235b-a22b", 94, 4096, 64, 4, 128, 8, 1536, 0, 0),
    ("mixtral-8x7b", 32, 4096, 32, 8, 8, 2, 14336, 0, 0),
]


@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_the_registry_holds_the_published_configs(config) -> None:
    name, *sizes = config
    s = MODELS.get(name)
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.experts, s.experts_per_token,
            s.expert_mlp, s.shared_experts, s.dense_layers) == tuple(sizes)  # fmt: skip


def test_kv_bytes_follow_the_shape() -> None:
    # DeepSeek-V3: 61 layers x (512 latent + 64 rotary) x 2 B = 70,272 B a token
    assert MODELS.get("deepseek-v3").kv_bytes_per_token() == 61 * 576 * 2
    # V3.2 adds the indexer's key: 128 B of FP8 and a 4 B scale a layer
    assert MODELS.get("deepseek-v3.2").kv_bytes_per_token() == 61 * (576 * 2 + 132)
    # Qwen3-30B-A3B: 48 layers x K and V x 4 heads x 128 x 2 B
    assert MODELS.get("qwen3-30b-a3b").kv_bytes_per_token() == 48 * 2 * 4 * 128 * 2
    assert MODELS.get("mixtral-8x7b").kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2


def test_active_parameters_match_the_published_totals() -> None:
    """2 x active weights is a token's FLOPs; the model cards say 37B active for DeepSeek-V3
    (with the 0.9B of embeddings), 3.3B for Qwen3-30B-A3B, 22B for Qwen3-235B-A22B and
    12.9B for Mixtral-8x7B: the count here (linear layers and LM head, no embeddings, no
    norms) is within 5 % of each, less the input embedding."""
    published = {  # active parameters, and the input embedding (hidden x vocab) to leave out
        "deepseek-v3": (37.0e9, 7168 * 129280),
        "qwen3-30b-a3b": (3.3e9, 2048 * 151936),
        "qwen3-235b-a22b": (22.0e9, 4096 * 151936),
        "mixtral-8x7b": (12.9e9, 4096 * 32000),
    }
    for name, (active, embedding) in published.items():
        assert active_params(MODELS.get(name)) == pytest.approx(active - embedding, rel=0.05), name


@pytest.mark.parametrize(
    ("model", "change", "field", "says"),
    [
        ("llama-3-8b", {"kv_lora_rank": 0, "q_lora_rank": 512}, "q_lora_rank", "no KV latent"),
        ("llama-3-8b", {"experts_per_token": 2}, "experts_per_token", "has none (experts 0)"),
        ("mixtral-8x7b", {"experts_per_token": 9}, "experts_per_token", "must be 1 to the"),
        ("mixtral-8x7b", {"dense_layers": 32}, "dense_layers", "below the model's 32 layers"),
        ("deepseek-v3.2", {"index_heads": 0}, "index_heads", "needs index_topk, index_heads"),
        ("deepseek-v3", {"experts": 10**5}, "experts", "must be <= 8192"),
    ],
)
def test_a_size_of_another_family_is_named(model, change, field, says) -> None:
    problem = shape_problem(replace(MODELS.get(model), **change))
    assert problem is not None and problem[0] == field and says in problem[1], problem


def test_latent_attention_replicates_its_cache_over_any_tp() -> None:
    assert shape_problem(MODELS.get("deepseek-v3"), 16) is None  # 128 heads split, latent whole
    assert shape_problem(MODELS.get("deepseek-v3"), 3)[0] == "tp"


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["admit.cost.ep=2"], "admit.cost.ep: expert parallelism needs experts, and the model "
         "(llama-3-8b) has none; allowed: 1"),
        (["admit.cost.model=mixtral-8x7b", "admit.cost.tp=4", "admit.cost.ep=2"],
         "admit.cost.ep: expert parallelism spans the tensor-parallel GPUs"),
        (["admit.cost.model=mixtral-8x7b", "admit.cost.tp=16", "admit.cost.ep=16"],
         "admit.cost.ep: must divide the model's 8 experts"),
        (["admit.cost.pp=33"], "admit.cost.pp: must be at most the model's 32 layers"),
        (["admit.cost.pp=0"], "admit.cost.pp: must be >= 1"),
        (["admit.cost.model_shape.kv_lora_rank=-1"], "admit.cost.model_shape.kv_lora_rank: "
         "must be >= 0"),
        (["admit.cost.model_shape.rope_head_dim=64"], "admit.cost.model_shape.rope_head_dim: "
         "is a size of multi-head latent attention"),
        (["admit.cost.kind=linear", "admit.cost.pp=2"], "admit.cost.pp: belongs to kind roofline"),
    ],
)  # fmt: skip
def test_parallelism_and_sizes_that_make_no_sense_are_refused(overrides, says) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("admit", None, overrides)
    assert says in str(err.value)


def test_a_refusal_reaches_the_command_line_in_one_line(cli) -> None:
    res = cli("admit", "admit.mode=serving", "admit.cost.model=llama-3-70b", "admit.cost.ep=8")
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "admit.cost.ep:" in res.output
