"""Config layering: the defaults, then the file, then the command-line overrides, and only the
merged result is validated, for every kind, for sweeps and for capacity searches. Each case
is a file that is refused alone, the refusal's advice, and the override that makes it valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpkv.core.config import load_config
from cpkv.core.errors import ConfigError

LINEAR_KEYS = (
    "kind: admit\nadmit:\n  mode: serving\n  cost: {fixed_us: 3000, prefill_token_us: 20}\n"
)
"""A serving config written before cost kinds existed: linear-model keys, default kind roofline."""

CASES = {  # kind: (file, the refusal, the override that makes the file valid)
    "admit": (LINEAR_KEYS, "set admit.cost.kind=linear", "admit.cost.kind=linear"),
    "alloc_host": (
        "kind: alloc_host\nalloc_host: {repeat: 3, rounds: 5}\n",
        "5 rounds cannot share 3 samples",
        "alloc_host.repeat=10",
    ),
    "alloc_l1": (
        "kind: alloc_l1\nalloc_l1: {repeat: 3, rounds: 5}\n",
        "5 rounds cannot share 3 samples",
        "alloc_l1.repeat=10",
    ),
    "trace_stats": (
        "kind: trace_stats\ntrace: {format: mooncake, prefix: {model: shared}}\n",
        "prefix",
        "trace.format=azure_csv",
    ),
    "trace_curve": (
        "kind: trace_curve\ntrace: {format: mooncake, prefix: {model: shared}}\n",
        "prefix",
        "trace.format=azure_csv",
    ),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_an_override_changes_which_keys_the_file_may_hold(tmp_path: Path, kind: str) -> None:
    text, refusal, override = CASES[kind]
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=refusal):
        load_config(kind, path)
    loaded = load_config(kind, path, [override])
    key, _, value = override.partition("=")
    node = loaded.experiment
    for part in key.split("."):
        node = getattr(node, part)
    assert str(node) == value


def test_the_refusals_advice_works_when_followed(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(LINEAR_KEYS)
    with pytest.raises(ConfigError) as refused:
        load_config("admit", path)
    advice = str(refused.value).split("set ", 1)[1].split(" ", 1)[0]  # admit.cost.kind=linear
    cost = load_config("admit", path, [advice]).experiment.admit.cost
    assert cost.kind == "linear" and cost.fixed_us == 3000


def test_an_override_cannot_set_keys_inside_a_value_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("kind: admit\nadmit: 5\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: admit: expected a mapping, got 5"):
        load_config("admit", path, ["admit.backend=model"])


def test_a_sweep_and_a_capacity_search_layer_their_overrides_the_same_way(tmp_path: Path) -> None:
    from cpkv.capacity.plan import plan_search
    from cpkv.sweep import plan_sweep

    path = tmp_path / "old.yaml"
    path.write_text(LINEAR_KEYS + "  slo: {ttft_ms: 500}\nsweep:\n  seed: [1, 2]\n")
    with pytest.raises(ConfigError, match="set admit.cost.kind=linear"):
        plan_sweep([str(path)], [])
    points = plan_sweep([str(path)], ["admit.cost.kind=linear"]).points
    assert [p.loaded().experiment.admit.cost.kind for p in points] == ["linear", "linear"]
    search = tmp_path / "search.yaml"
    search.write_text(LINEAR_KEYS + "  slo: {ttft_ms: 500}\n")
    with pytest.raises(ConfigError, match="set admit.cost.kind=linear"):
        plan_search(str(search), [])
    plan = plan_search(str(search), ["admit.cost.kind=linear"])
    assert plan is not None
