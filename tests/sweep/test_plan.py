"""Planning a sweep: points from configs x grids, deterministic names, validation before anything runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cpkv.core.errors import ConfigError
from cpkv.sweep import plan_sweep
from tests.helpers.paths import CONFIGS
from tests.helpers.sweep_fake_kind import fake_kind  # noqa: F401  (fixture)

HOST = {
    "kind": "alloc_host",
    "name": "host-tiny",
    "alloc_host": {
        "host_sizes_gb": [],
        "host_pages": [600],
        "request_pages": [8],
        "repeat": 3,
        "warmup": 1,
    },
}


def write(tmp_path: Path, name: str, doc: dict) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def test_file_grid_and_command_line_axis(tmp_path: Path) -> None:
    cfg = write(tmp_path, "h.yaml", {**HOST, "sweep": {"alloc_host.protocol": ["cold", "warm"]}})
    plan = plan_sweep([cfg], ["alloc_host.host_pages=600,1200", "alloc_host.repeat=4"])
    swept = [
        (p.swept["alloc_host.protocol"], p.swept["alloc_host.host_pages"]) for p in plan.points
    ]
    assert swept == [("cold", [600]), ("cold", [1200]), ("warm", [600]), ("warm", [1200])]
    assert [p.name for p in plan.points] == [
        "000_host-tiny_protocol=cold_host_pages=600",
        "001_host-tiny_protocol=cold_host_pages=1200",
        "002_host-tiny_protocol=warm_host_pages=600",
        "003_host-tiny_protocol=warm_host_pages=1200",
    ]
    for p in plan.points:
        assert p.config["alloc_host"]["repeat"] == 4  # plain overrides reach every point
        assert p.overrides[0] == "alloc_host.repeat=4"
        assert p.timed and p.kind == "alloc_host"
    assert plan.swept_keys == ("alloc_host.protocol", "alloc_host.host_pages")
    # planning twice gives the same points
    assert (
        plan_sweep([cfg], ["alloc_host.host_pages=600,1200", "alloc_host.repeat=4"]).points
        == plan.points
    )


def test_list_values_stay_lists(tmp_path: Path) -> None:
    cfg = write(tmp_path, "h.yaml", HOST)
    plan = plan_sweep([cfg], ["alloc_host.request_pages=[1,8],[64]"])
    assert [p.config["alloc_host"]["request_pages"] for p in plan.points] == [[1, 8], [64]]
    single = plan_sweep([cfg], ["alloc_host.request_pages=[1,8]"])
    assert len(single.points) == 1 and single.points[0].swept == {}


def test_command_line_replaces_a_file_axis(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        "h.yaml",
        {**HOST, "sweep": {"alloc_host.protocol": ["cold", "warm"], "alloc_host.repeat": [3, 5]}},
    )
    plan = plan_sweep([cfg], ["alloc_host.protocol=warm", "alloc_host.repeat=6,7,8"])
    assert [(p.config["alloc_host"]["protocol"], p.config["alloc_host"]["repeat"]) for p in plan.points] == [
        ("warm", 6), ("warm", 7), ("warm", 8)
    ]  # fmt: skip


def test_mixed_kinds_get_only_their_overrides(tmp_path: Path, fake_kind) -> None:  # noqa: F811
    host = write(tmp_path, "h.yaml", HOST)
    echo = write(
        tmp_path,
        "e.yaml",
        {"kind": "sweeptest", "name": "echo", "sweep": {"sweeptest.scale": [1.0, 2.0]}},
    )
    plan = plan_sweep([host, echo], ["alloc_host.repeat=2,3", "sweeptest.ticks=4", "seed=7"])
    assert [(p.kind, p.index) for p in plan.points] == [
        ("alloc_host", 0),
        ("alloc_host", 1),
        ("sweeptest", 2),
        ("sweeptest", 3),
    ]
    assert [p.config["seed"] for p in plan.points] == [7, 7, 7, 7]
    assert plan.points[2].config["sweeptest"]["ticks"] == 4 and not plan.points[2].timed
    assert plan.name == "host-tiny+echo"
    with pytest.raises(
        ConfigError,
        match=r"override 'alloc_host.repeat=1,2': no config of the sweep has key alloc_host.repeat \(kinds: sweeptest\)",
    ):
        plan_sweep([echo], ["alloc_host.repeat=1,2"])


def test_every_point_is_validated_before_anything_runs(tmp_path: Path) -> None:
    cfg = write(tmp_path, "h.yaml", {**HOST, "sweep": {"alloc_host.page_size": [16, 0]}})
    with pytest.raises(
        ConfigError,
        match=r"h.yaml:\d+: sweep alloc_host.page_size=0: alloc_host.page_size: must be > 0",
    ):
        plan_sweep([cfg])
    with pytest.raises(ConfigError, match="alloc_host.nope: unknown key"):
        plan_sweep([cfg], ["alloc_host.nope=1,2"])
    with pytest.raises(ConfigError, match="name one or more config files"):
        plan_sweep([])


GRID_TEXT = """\
kind: alloc_host
name: host-tiny
alloc_host: {host_sizes_gb: [], host_pages: [600], request_pages: [8], repeat: 3, warmup: 1}
sweep:
  zip:
    alloc_host.repeat: [3, -1]
    alloc_host.warmup: [1, 2]
  alloc_host.protocol: [cold, warm]
  alloc_host.page_size:
    - 16
    - 0
"""


def test_a_bad_value_of_a_file_grid_names_the_file_line_and_point(tmp_path: Path) -> None:
    cfg = tmp_path / "g.yaml"
    cfg.write_text(GRID_TEXT)
    with pytest.raises(ConfigError) as err:
        plan_sweep([str(cfg)])
    assert str(err.value) == (
        f"{cfg}:11: sweep alloc_host.page_size=0: alloc_host.page_size: must be > 0, got 0"
    )
    # a value in a zip group: the line of its list
    with pytest.raises(ConfigError) as err:
        plan_sweep([str(cfg)], ["alloc_host.page_size=16"])
    assert str(err.value).startswith(f"{cfg}:6: sweep alloc_host.repeat=-1: alloc_host.repeat: ")
    # a value typed on the command line is still named as the override it is
    with pytest.raises(ConfigError) as err:
        plan_sweep([str(cfg)], ["alloc_host.page_size=16,-3"])
    assert str(err.value).startswith("override 'alloc_host.page_size=-3': alloc_host.page_size: ")
    # a zip key set alone on the command line: the line of that key
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(cfg))}:6: alloc_host.repeat moves in a zip: group"
    ):
        plan_sweep([str(cfg)], ["alloc_host.repeat=4"])


def test_a_zip_key_cannot_be_set_alone(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        "h.yaml",
        {**HOST, "sweep": {"zip": {"alloc_host.page_size": [16, 64], "alloc_host.repeat": [3, 5]}}},
    )
    assert [(p.config["alloc_host"]["page_size"], p.config["alloc_host"]["repeat"]) for p in plan_sweep([cfg]).points] == [
        (16, 3), (64, 5)
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="moves in a zip: group"):
        plan_sweep([cfg], ["alloc_host.repeat=4"])


def test_shipped_sweep_configs_plan(tmp_path: Path) -> None:
    root = CONFIGS / "sweeps"
    sizes = {p.name: len(plan_sweep([str(p)]).points) for p in sorted(root.glob("*.yaml"))}
    assert sizes["host_small.yaml"] == 3 * 2
    assert sizes["host_page_size_zip.yaml"] == 3 * 2


def test_point_names_spell_values_as_the_config_does() -> None:
    from cpkv.sweep.plan import point_name

    swept = {"admit.chunked_prefill_size": None, "admit.release_each_tick": True, "a.l": [1, 2]}
    assert (
        point_name(3, 3, "cfg", swept)
        == "003_cfg_chunked_prefill_size=null_release_each_tick=true_l=1+2"
    )
