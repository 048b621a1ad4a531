"""Bounds next to a key's type (``Annotated[T, Range(...)]``), rules across keys, keys that
belong to another choice: the schema's own mechanism, on toy schemas and on every kind."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import pytest

from cpkv.core.kinds import KINDS
from cpkv.core.schema import FieldError, Range, build
from cpkv.core.schema.keys import belongs_to, check_bounds, leaves

Share = Annotated[float, Range(0, 1, low_open=True, why="a share", low_why="none is no share")]
Count = Annotated[int, Range(1, 100, why="a hundred at most")]


@dataclass(frozen=True)
class Inner:
    share: Share = 0.5


@dataclass(frozen=True)
class Toy:
    count: Count = 1
    maybe: Count | None = None
    many: tuple[Count, ...] = ()
    inner: Inner = Inner()
    kind: str = "a"
    a_only: int = 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"count": 0}, "count: must be >= 1, got 0"),
        ({"count": 101}, "count: must be <= 100 (a hundred at most), got 101"),
        ({"maybe": 1000}, "maybe: must be <= 100 (a hundred at most), got 1000"),
        ({"many": [5, 0]}, "many[1]: must be >= 1, got 0"),
        ({"inner": {"share": 0}}, "inner.share: must be > 0 (none is no share), got 0"),
        ({"inner": {"share": 1e30}}, "inner.share: must be <= 1 (a share), got 1e+30"),
        (
            {"count": 10**400},
            "count: must be <= 100 (a hundred at most), got an integer of 401 digits",
        ),
    ],
)
def test_a_value_past_a_bound_names_the_key_the_bound_and_why(data, message) -> None:
    with pytest.raises(FieldError) as err:
        build(Toy, data)
    assert str(err.value) == message


def test_values_within_the_bounds_and_null_pass() -> None:
    toy = build(Toy, {"count": 100, "maybe": None, "many": [1, 100], "inner": {"share": 1}})
    assert (toy.count, toy.maybe, toy.many, toy.inner.share) == (100, None, (1, 100), 1.0)


def test_leaves_list_every_key_with_its_bounds() -> None:
    by_key = {leaf.key: leaf for leaf in leaves(Toy)}
    assert list(by_key) == ["count", "maybe", "many", "inner.share", "kind", "a_only"]
    assert by_key["maybe"].nullable and by_key["many"].is_list
    assert by_key["inner.share"].ranges == (Share.__metadata__[0],)
    assert by_key["kind"].ranges == () and by_key["count"].default == 1


def test_check_bounds_covers_objects_made_without_build() -> None:
    with pytest.raises(FieldError, match=r"many\[0\]: must be <= 100"):
        check_bounds(Toy(many=(500,)))
    check_bounds(Toy(count=7))


def test_a_key_of_another_choice_is_refused_in_one_line() -> None:
    with pytest.raises(FieldError) as err:
        belongs_to(
            Toy(a_only=3), ("a_only",), owner="x.kind", needed="a", chosen="b", reads=("count",)
        )
    assert err.value.key == "a_only"
    assert str(err.value) == (
        "a_only: belongs to kind a, and this x.kind is b (it would be ignored); set x.kind=a "
        "to use it, or remove it (kind b reads: count)"
    )
    belongs_to(Toy(), ("a_only",), owner="x.kind", needed="a", chosen="b", reads=())


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_default_lies_within_its_own_bounds(kind: str) -> None:
    for leaf in leaves(KINDS.get(kind).config_cls()):
        values = leaf.default if leaf.is_list else (leaf.default,)
        for value in values or ():
            if value is not None:
                assert all(b.problem(value) is None for b in leaf.ranges), (leaf.key, value)


def test_every_bound_of_every_kind_is_a_finite_number_with_a_reason() -> None:
    for kind in KINDS:
        for leaf in leaves(KINDS.get(kind).config_cls()):
            for bound in leaf.ranges:
                for b in (bound.low, bound.high):
                    if b is not None:
                        assert math.isfinite(b), leaf.key
                if bound.high is not None:
                    assert bound.why, f"{leaf.key}: an upper bound says why"
