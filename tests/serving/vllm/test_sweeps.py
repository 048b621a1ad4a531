"""``cpkv sweep`` over ``admit.engine`` and ``cpkv capacity`` under ``admit.engine: vllm``, on
the serving config whose capacity is known in closed form (tests/helpers/closed_form.py): a
fixed ``F`` per iteration, prompts of 4 tokens, one output token, one request at a time. vLLM
with ``max_num_seqs: 1`` serves exactly one request a step (admitted, prefilled, its token,
finished; the next admitted in the next step), as SGLang with ``prefill_max_requests: 1``
does: both serve ``R = 1 / F`` requests per second, and their attainments are the same
closed form.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cpkv.capacity import run_capacity
from cpkv.sweep import run_sweep
from tests.helpers import closed_form as cf


def vllm_config(folder: Path, sweep: dict | None = None) -> Path:
    path = cf.write_config(folder)
    doc = yaml.safe_load(path.read_text())
    del doc["admit"]["prefill_max_requests"]  # SGLang's: refused under engine vllm
    doc["admit"].update(engine="vllm", vllm={"max_num_seqs": 1})
    if sweep is not None:
        doc["sweep"] = sweep
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_capacity_search_under_vllm_finds_the_closed_form(tmp_path: Path) -> None:
    config = vllm_config(tmp_path / "case")
    res = run_capacity(str(config), flags={"tolerance": 0.02}, root=tmp_path / "exp")
    (search,) = res.results
    assert search.outcome == "found"
    low, high = search.bracket
    assert low <= cf.THRESHOLD_SPEEDUP < high <= low * 1.02
    for point in search.points:
        assert point.attainment_pct == pytest.approx(cf.attainment_pct(point.load), abs=1e-9)


def test_a_sweep_over_the_engine_gives_both_the_closed_form(tmp_path: Path) -> None:
    sweep = {
        "zip": {"admit.engine": ["cpkv", "vllm"], "admit.prefill_max_requests": [1, None]},
        "admit.arrivals.speedup": [0.4, 0.8],
    }
    config = vllm_config(tmp_path / "case", sweep)
    res = run_sweep([str(config)], root=tmp_path / "exp")
    summary = json.loads((res.path / "summary.json").read_text())
    points = summary["points"]
    assert [p["status"] for p in points] == ["complete"] * 4
    slo = {}
    for p in points:
        run = res.path / p["name"]
        doc = json.loads((run / "results.json").read_text())
        engine = yaml.safe_load((run / "config.yaml").read_text())["admit"]["engine"]
        speedup = yaml.safe_load((run / "config.yaml").read_text())["admit"]["arrivals"]["speedup"]
        (row,) = doc["rows"]
        assert doc["summary"]["engine"] == engine
        assert row["slo_attainment_pct"] == pytest.approx(cf.attainment_pct(speedup), abs=1e-9)
        slo[engine, speedup] = (row["slo_attainment_pct"], row["ttft_p99_ms"])
    for speedup in (0.4, 0.8):
        assert slo["cpkv", speedup] == pytest.approx(slo["vllm", speedup], rel=1e-12)
