"""Overrides whose value is not valid YAML are user errors, not tracebacks."""

from __future__ import annotations

import pytest

from cpkv.config import load_config
from cpkv.errors import ConfigError


@pytest.mark.parametrize("override", ["admit.workload.source=[1", "admit.page_size={a"])
def test_unparsable_override_value_is_a_config_error(override: str) -> None:
    with pytest.raises(ConfigError, match=r"overrides .*: did not find expected"):
        load_config("admit", None, [override])


def test_unparsable_override_exits_2_with_one_line(cli) -> None:
    res = cli("admit", "admit.workload.source=[1", "--print-config", output=False)
    assert res.exit_code == 2
    assert res.stderr.startswith("cpkv: error: overrides admit.workload.source=[1: ")
    assert len(res.stderr.strip().splitlines()) == 1
