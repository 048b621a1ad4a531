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


def test_an_override_cannot_hide_a_bad_value_in_the_file(tmp_path) -> None:
    import pytest

    from cpkv.core.config import load_config
    from cpkv.core.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text("kind: admit\nadmit: 5\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: admit: expected a mapping"):
        load_config("admit", path, ["admit.backend=model"])
