"""Bounded YAML: what stays accepted (small aliases, merge keys, interpolations of one value)
and where each bound falls, at small limits so the cases stay readable."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpkv.core.config import load_config
from cpkv.core.errors import ConfigError, UnsupportedError
from cpkv.core.files.yaml_input import Limits, parse_yaml
from cpkv.core.memory import GIB, MemoryNeed, check_fits


def load(text: str, **limits: int):
    return parse_yaml(text, "c.yaml", ConfigError, Limits(**limits))


def test_aliases_and_merge_keys_within_bounds_are_fine() -> None:
    assert load("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}
    text = "base: &b {x: 1, y: 2}\nmine:\n  <<: *b\n  y: 3\n"
    assert load(text)["mine"] == {"x": 1, "y": 3}  # a merge key is not a repeated key


def test_a_repeated_key_names_both_lines() -> None:
    with pytest.raises(ConfigError, match=r"^c.yaml:4: duplicate key 'y' \(first at line 3\)"):
        load("a: 1\nb:\n  y: 1\n  y: 2\n")


def test_the_depth_bound() -> None:
    # depth counts every mapping and list: "x: [[1]]" is mapping > list > list > scalar = 4
    assert load("x: [[1]]\n", max_depth=4) == {"x": [[1]]}
    with pytest.raises(ConfigError, match="nested more than 3 levels deep"):
        load("x: [[1]]\n", max_depth=3)
    # through aliases: a (depth 2 below a's key) nested once more by b
    with pytest.raises(ConfigError, match="once its aliases are expanded"):
        load("a: &a [[1]]\nb: [*a]\n", max_depth=4)


def test_the_value_bound_counts_aliases_expanded() -> None:
    # "a: [1, 1, 1]": the mapping, the key, the list and 3 scalars = 6 values
    assert load("a: [1, 1, 1]\n", max_values=6) == {"a": [1, 1, 1]}
    with pytest.raises(ConfigError, match="more than 5 values"):
        load("a: [1, 1, 1]\n", max_values=5)
    # b repeats a's list (4 values) twice: 6 + key b + list + 2 x 4 = 16 once expanded
    text = "a: &a [1, 1, 1]\nb: [*a, *a]\n"
    assert load(text, max_values=16)["b"] == [[1, 1, 1], [1, 1, 1]]
    with pytest.raises(ConfigError, match="more than 15 values once its aliases are expanded"):
        load(text, max_values=15)


def test_an_interpolation_of_one_value_still_works(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kind: admit\nadmit:\n  max_prefill_tokens: ${admit.available_tokens}\n")
    assert load_config("admit", cfg).experiment.admit.max_prefill_tokens == 20000
    cfg.write_text("kind: admit\nadmit:\n  max_prefill_tokens: ${admit.cp}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3: admit.max_prefill_tokens: interpolation"):
        load_config("admit", cfg)


def test_memory_check() -> None:
    check_fits(None)
    check_fits(MemoryNeed(GIB, "x"), available=2 * GIB)
    with pytest.raises(
        UnsupportedError, match=r"^x needs at least 3 GiB, this machine has 2 GiB available"
    ):
        check_fits(MemoryNeed(3 * GIB, "x"), available=2 * GIB)
