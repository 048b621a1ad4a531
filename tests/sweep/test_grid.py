"""Sweep grid syntax: cartesian products, zip groups, command-line sweeps, value formatting."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cpkv.core.config import parse_overrides
from cpkv.core.errors import ConfigError
from cpkv.sweep.grid import (
    Axis,
    axes_from_block,
    axes_from_overrides,
    expand,
    format_value,
    split_top_level,
)


def test_cartesian_product_last_key_fastest() -> None:
    axes = axes_from_block({"a.x": [1, 2], "b": ["u", "v", "w"]}, "f.yaml")
    points = expand(axes)
    # written out by hand: 2 x 3 points, b varies fastest
    assert points == [
        {"a.x": "1", "b": "u"}, {"a.x": "1", "b": "v"}, {"a.x": "1", "b": "w"},
        {"a.x": "2", "b": "u"}, {"a.x": "2", "b": "v"}, {"a.x": "2", "b": "w"},
    ]  # fmt: skip


def test_zip_moves_in_lock_step_where_it_stands() -> None:
    block = {"a": [1, 2], "zip": {"p": [16, 64], "q": [3, 5]}, "c": [True]}
    points = expand(axes_from_block(block, "f.yaml"))
    assert [(p["a"], p["p"], p["q"]) for p in points] == [
        ("1", "16", "3"), ("1", "64", "5"), ("2", "16", "3"), ("2", "64", "5")
    ]  # fmt: skip
    assert all(p["c"] == "true" for p in points)


def test_several_zip_groups_and_their_errors() -> None:
    block = {"zip": [{"a": [1, 2], "b": [3, 4]}, {"c": [5, 6, 7], "d": [8, 9, 10]}]}
    assert len(expand(axes_from_block(block, "f.yaml"))) == 2 * 3
    with pytest.raises(
        ConfigError,
        match=r"f.yaml: sweep.zip: lists moving in lock-step must be equally long \(got a: 2, b: 3\)",
    ):
        axes_from_block({"zip": {"a": [1, 2], "b": [1, 2, 3]}}, "f.yaml")
    with pytest.raises(ConfigError, match="sweep.a: expected a non-empty list"):
        axes_from_block({"a": 3}, "f.yaml")
    with pytest.raises(ConfigError, match="a is swept twice"):
        axes_from_block({"a": [1], "zip": {"a": [1], "b": [2]}}, "f.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sweep:\n  a: [1]\n  b: 3\n", "{f}:3: sweep.b: expected a non-empty list of values to sweep, got 3"),
        ("sweep:\n  c:\n    - 1\n    - .nan\n", "{f}:4: sweep.c: nan is not a finite number"),
        ("sweep:\n  zip:\n    - {p: [1], q: [3]}\n    - {r: [1, 2], s: [3]}\n",
         "{f}:4: sweep.zip: lists moving in lock-step must be equally long (got r: 2, s: 1)"),
        ("sweep:\n  zip: {r: [1, 2], s: [3]}\n",
         "{f}:2: sweep.zip: lists moving in lock-step must be equally long (got r: 2, s: 1)"),
        ("sweep:\n  a: [1]\n  zip:\n    b: [1]\n    a: [2]\n", "{f}:5: sweep: a is swept twice"),
        ("sweep: [1, 2]\n", "{f}:1: sweep: expected a mapping of dotted keys to lists of values"),
    ],
)  # fmt: skip
def test_block_errors_name_the_file_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        axes_from_block(yaml.safe_load(text)["sweep"], str(path))
    assert str(err.value) == message.format(f=path)


def test_size_of_the_grid_is_the_product_of_axis_lengths() -> None:
    lengths = [2, 1, 3, 2]
    axes = [
        Axis((f"k{i}",), tuple((str(v),) for v in range(n)), "t") for i, n in enumerate(lengths)
    ]
    points = expand(axes)
    assert len(points) == 12
    # every combination exactly once
    combos = {tuple(p[f"k{i}"] for i in range(4)) for p in points}
    assert combos == {tuple(map(str, c)) for c in itertools.product(*(range(n) for n in lengths))}


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("1,8,64", ["1", "8", "64"]),
        ("[1,8],[64]", ["[1,8]", "[64]"]),
        ("[1,8]", ["[1,8]"]),
        ('"a,b",c', ['"a,b"', "c"]),
        ("{x: 1, y: 2},{x: 3}", ["{x: 1, y: 2}", "{x: 3}"]),
        ("warm", ["warm"]),
    ],
)
def test_split_top_level(text: str, parts: list[str]) -> None:
    assert split_top_level(text) == parts


def test_command_line_sweeps_and_plain_overrides() -> None:
    plain, axes = axes_from_overrides(["a.b=1,2", "c=[1,2]", "d=range(1,4)", "e=x,y", "f=3"])
    assert plain == ["c=[1,2]", "f=3"]
    assert [(ax.keys, ax.values) for ax in axes] == [
        (("a.b",), (("1",), ("2",))),
        (("d",), (("1",), ("2",), ("3",))),
        (("e",), (("x",), ("y",))),
    ]


def test_range_with_a_float_step() -> None:
    _, (axis,) = axes_from_overrides(["r=range(0,1,0.25)"])
    assert [float(v) for (v,) in axis.values] == [0.0, 0.25, 0.5, 0.75]


def test_zip_option_ties_command_line_keys() -> None:
    _, axes = axes_from_overrides(["a=1,2", "b=3", "c=5,6", "d=7,8,9"], ["a,c"])
    assert [ax.keys for ax in axes] == [("a", "c"), ("d",)]
    assert expand(axes)[:2] == [{"a": "1", "c": "5", "d": "7"}, {"a": "1", "c": "5", "d": "8"}]
    with pytest.raises(ConfigError, match="equally many values"):
        axes_from_overrides(["a=1,2", "d=7,8,9"], ["a,d"])
    with pytest.raises(ConfigError, match="not swept: b"):
        axes_from_overrides(["a=1,2", "b=3"], ["a,b"])


def test_bad_command_line_sweeps() -> None:
    with pytest.raises(ConfigError, match="range takes 1 to 3 numbers"):
        axes_from_overrides(["r=range(a)"])
    with pytest.raises(ConfigError, match="the range is empty"):
        axes_from_overrides(["r=range(3,1)"])
    with pytest.raises(ConfigError, match="empty value"):
        axes_from_overrides(["r=1,,2"])


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=8)


@given(_values)
def test_format_value_round_trips_through_the_override_parser(value: object) -> None:
    parsed = parse_overrides([f"k={format_value(value)}"])["k"]
    assert parsed == value and type(parsed) is type(value)
