"""A capacity search over deployments (capacity.gpus): the splits it generates, the frontier
it names, and a whole search whose ordering follows from a flat cost model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cpkv.capacity.deployments import deployment_axis, deployment_of, frontier
from cpkv.core.errors import ConfigError
from tests.helpers import closed_form as cf


def _resolved(prefill_tp: int | None = None, decode_tp: int | None = None, tp: int = 1) -> dict:
    return {
        "admit": {
            "cost": {"kind": "roofline", "tp": tp, "pp": 1},
            "cluster": {
                "instances": 1,
                "prefill": {"instances": 1, "router": "prefix_aware", "cost": {"tp": prefill_tp}},
                "decode": {"instances": 1, "router": "round_robin", "cost": {"tp": decode_tp}},
            },
        }
    }


def _names(axis, resolved: dict) -> list[str]:
    """The deployments of the axis' values, as each override would set them."""
    out = []
    for (text,) in axis.values:
        value = yaml.safe_load(text)
        cluster = {**resolved["admit"]["cluster"]}
        for key, part in value.items():
            cluster[key] = {**cluster[key], **part} if isinstance(part, dict) and isinstance(
                cluster.get(key), dict) else part  # fmt: skip
        out.append(deployment_of({"admit": {**resolved["admit"], "cluster": cluster}}))
    return out


def test_every_split_of_each_gpu_count() -> None:
    resolved = _resolved()
    axis = deployment_axis(resolved, (2, 4), True, "here")
    assert axis.keys == ("admit.cluster",)
    assert _names(axis, resolved) == [
        ("1P1D", 2), ("2 colocated", 2),
        ("1P3D", 4), ("2P2D", 4), ("3P1D", 4), ("4 colocated", 4),
    ]  # fmt: skip
    colocated = yaml.safe_load(axis.values[1][0])
    assert colocated["prefill"] is None and colocated["router"] == "prefix_aware"


def test_splits_count_each_pool_s_gpus() -> None:
    # prefill instances of TP 2, decode of TP 1, colocated of TP 1: 6 GPUs = 1P4D, 2P2D
    resolved = _resolved(prefill_tp=2)
    axis = deployment_axis(resolved, (6,), False, "here")
    assert _names(axis, resolved) == [("1P4D", 6), ("2P2D", 6)]
    with pytest.raises(ConfigError, match="capacity.gpus: 2 GPUs hold no deployment"):
        deployment_axis(resolved, (2,), False, "here")
    with pytest.raises(ConfigError, match="holds no disaggregated deployment"):
        deployment_axis({"admit": {"cost": {}, "cluster": {"instances": 1}}}, (2,), True, "here")


def test_frontier_by_hand() -> None:
    searches = [
        {"deployment": "1P1D", "gpus": 2, "capacity_load": 0.5},
        {"deployment": "2 colocated", "gpus": 2, "capacity_load": 0.7},
        {"deployment": "3P1D", "gpus": 4, "capacity_load": 2.0},
        {"deployment": "2P2D", "gpus": 4, "capacity_load": 1.3},
        {"deployment": "1P3D", "gpus": 4, "capacity_load": None},  # not found
    ]
    f = frontier(searches, 0.6)
    assert [(x["gpus"], x["deployment"]) for x in f["best_per_gpus"]] == [
        (2, "2 colocated"), (4, "3P1D"),
    ]  # fmt: skip
    assert f["cheapest"] == {"deployment": "2 colocated", "gpus": 2, "capacity_load": 0.7}
    assert frontier(searches, 1.5)["cheapest"]["deployment"] == "3P1D"
    assert frontier(searches, 5.0)["cheapest"] is None


def test_a_search_of_deployments(cli, tmp_path: Path) -> None:
    # the closed-form config (one request per prefill batch, a flat F per iteration) with two
    # output tokens: a prefill instance serves one request per F (its prefill and first token),
    # a decode instance decodes every request it holds in one iteration; so xPyD takes about
    # x times what 1P1D takes, whatever y, and a colocated instance one request per F too
    # (each iteration a prefill and the previous request's decode)
    config = cf.write_config(
        tmp_path / "case",
        extra={"capacity": {"gpus": [2, 3], "target_load": 0.9, "tolerance": 0.05}},
    )
    doc = yaml.safe_load(config.read_text())
    arrivals = Path(doc["admit"]["workload"]["path"])
    arrivals.write_text(arrivals.read_text().replace('"max_new_tokens": 1', '"max_new_tokens": 2'))
    doc["admit"]["slo"] = {"ttft_ms": 3 * cf.F_US / 1000.0}
    # (a decode pool with room for SGLang's 512 tokens reserved per decoding request)
    doc["admit"]["cluster"] = {
        "prefill": {"instances": 1}, "decode": {"instances": 1, "capacity_blocks": 4096},
        "link": {"kind": "instant"},
    }  # fmt: skip
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = cli("capacity", str(config))
    assert res.exit_code == 0, res.output
    (search,) = [p.parent for p in cli.root.rglob("capacity.json")]
    result = json.loads((search / "capacity.json").read_text())
    cap = {s["deployment"]: s["capacity_load"] for s in result["searches"]}
    assert set(cap) == {"1P1D", "2 colocated", "1P2D", "2P1D", "3 colocated"}
    assert cap["2P1D"] / cap["1P1D"] == pytest.approx(2.0, rel=0.15)
    assert cap["1P2D"] == pytest.approx(cap["1P1D"], rel=0.1)
    assert cap["3 colocated"] / cap["2 colocated"] == pytest.approx(1.5, rel=0.15)
    best = {x["gpus"]: x["deployment"] for x in result["frontier"]["best_per_gpus"]}
    assert best == {2: "2 colocated", 3: "3 colocated"}
    assert result["frontier"]["cheapest"]["gpus"] == 2
    text = (search / "capacity.txt").read_text()
    assert "deployments by GPUs" in text and "cheapest deployment for speedup 0.9" in text


def test_gpus_and_another_axis_are_refused(cli, tmp_path: Path) -> None:
    config = cf.write_config(tmp_path / "case", extra={"capacity": {"gpus": [2]}})
    doc = yaml.safe_load(config.read_text())
    doc["admit"]["cluster"] = {"prefill": {"instances": 1}, "decode": {"instances": 1}}
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = cli("capacity", str(config), "admit.kv.capacity_blocks=64,128")
    assert res.exit_code == 2
    assert "capacity.gpus generates the second axis" in res.output
    res = cli("capacity", str(config), "capacity.gpus=[4,2]")
    assert res.exit_code == 2
    assert "capacity.gpus: must be GPU counts" in res.output
