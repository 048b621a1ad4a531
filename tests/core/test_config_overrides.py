"""Overrides whose value is not valid YAML are user errors, not tracebacks."""

from __future__ import annotations

import pytest

from cpkv.core.config import load_config
from cpkv.core.errors import ConfigError


@pytest.mark.parametrize("override", ["admit.workload.source=[1", "admit.page_size={a"])
def test_unparsable_override_value_is_a_config_error(override: str) -> None:
    with pytest.raises(ConfigError, match=r"override '.*': did not find expected"):
        load_config("admit", None, [override])


def test_unparsable_override_exits_2_with_one_line(cli) -> None:
    res = cli("admit", "admit.workload.source=[1", "--print-config", output=False)
    assert res.exit_code == 2
    assert res.stderr.startswith("cpkv: error: override 'admit.workload.source=[1': ")
    assert len(res.stderr.strip().splitlines()) == 1


def test_schema_refuses_types_it_cannot_check() -> None:
    from dataclasses import dataclass

    import pytest

    from cpkv.core.schema import build

    @dataclass(frozen=True)
    class Either:
        x: int | str = 0

    @dataclass(frozen=True)
    class Pair:
        x: tuple[int, int] = (0, 0)

    with pytest.raises(TypeError, match="only `X | None` unions"):
        build(Either, {"x": 1})
    with pytest.raises(TypeError, match=r"use tuple\[X, \.\.\.\]"):
        build(Pair, {"x": [1, 2]})


def _omegaconf_merge(defaults: dict, file_data: dict, override_data: dict) -> dict:
    from omegaconf import OmegaConf

    parts = (OmegaConf.create(x) for x in (defaults, file_data, override_data))
    return OmegaConf.to_container(OmegaConf.merge(*parts), resolve=True)


def test_a_plain_merge_is_what_omegaconf_merges_for_every_shipped_config() -> None:
    from cpkv.core import config as C
    from cpkv.core.kinds import KINDS
    from cpkv.core.schema import to_dict
    from tests.helpers.paths import REPO

    overrides = C.parse_overrides(["seed=3", "name=x", "admit.kv.capacity_blocks=64"])
    checked = 0
    for path in sorted((REPO / "configs").rglob("*.yaml")):
        data = C.read_yaml(path)
        for key in C.SWEEP_KEYS:
            data.pop(key, None)
        kind = data.get("kind")
        if kind not in KINDS:
            continue
        defaults = to_dict(KINDS.get(kind).config_cls()())
        extra = overrides if kind == "admit" else {}
        assert C._plain(data) and C._plain(extra)
        assert C._merge(defaults, data, extra, str(path)) == _omegaconf_merge(defaults, data, extra)
        checked += 1
    assert checked >= 30


def test_an_interpolation_or_another_type_goes_through_omegaconf() -> None:
    from cpkv.core import config as C

    assert not C._plain({"a": "${b}"}) and not C._plain({"a": [1, {"b": b"x"}]})
    assert not C._plain({1: "a"}) and C._plain({"a": [1, 2.5, None, True, "x"]})
    merged = C._merge({"b": 3, "a": 0}, {"a": "${b}"}, {}, "f.yaml")
    assert merged == {"b": 3, "a": 3}


PLAIN_VALUES = [
    "cpkv", "sglang", "prefill_adder", "a-b_c9", "x", "Y", "n", "yes", "No", "TRUE", "false",
    "On", "OFF", "null", "Null", "NULL", "none", "nan", "inf", "0", "7", "-3", "1000000",
    "007", "0x1F", "1_000", "-0", "0.5", "-2.25", "1.50", "1e3", "1.5e-3", ".5", "5.", "+3",
    "~", "", "${seed}", "[1, 2]", "a b", "'quoted'", "2026-12-03", "12:30", "=",
]  # fmt: skip


@pytest.mark.parametrize("value", PLAIN_VALUES)
@pytest.mark.parametrize("key", ["seed", "admit.engine", "admit.workload.limit", "a.b-c.d_e"])
def test_an_override_reads_as_omegaconf_reads_it(key: str, value: str) -> None:
    """The overrides read without OmegaConf (a plain dotted key and a word, a decimal
    integer or a plain decimal) give what OmegaConf's dotlist gives; anything else is read
    by OmegaConf itself."""
    import math

    from omegaconf import OmegaConf

    from cpkv.core import config as C

    item = f"{key}={value}"
    try:
        expected = OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=False)
    except Exception:  # (a value OmegaConf cannot read: a one-line error here)
        with pytest.raises(ConfigError):
            C.parse_overrides([item])
        return
    got = C.parse_overrides([item])
    assert got == expected or (math.isnan(_leaf(got)) and math.isnan(_leaf(expected)))
    plain = C._plain_override(key, value)
    if plain is not None:  # (each kind of plain value is one of these)
        assert plain == expected
        assert type(_leaf(plain)) is type(_leaf(expected))


def _leaf(tree: object) -> object:
    while isinstance(tree, dict):
        (tree,) = tree.values()
    return tree


def test_plain_overrides_take_the_path_without_omegaconf() -> None:
    from cpkv.core import config as C

    for item in ("admit.engine=cpkv", "admit.workload.limit=200", "admit.x.rate=0.25"):
        key, _, value = item.partition("=")
        assert C._plain_override(key, value) is not None, item
    for item in ("a.b=yes", "a.b=null", "a.b=007", "a.b=1e3", "a[0]=1", "a.b=${seed}"):
        key, _, value = item.partition("=")
        assert C._plain_override(key, value) is None, item
