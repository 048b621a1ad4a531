"""The compiled serving engine decides as its sources do.

The test suite runs the sources (``tests/conftest.py``); here the same commands run twice in
subprocesses, once from the compiled modules (:mod:`cpkv.native`) and once from the sources:
random serving scenarios drawn by the golden-output harness (every policy, the queue
orders, priorities, deadlines, cancellations, preemption modes, CUDA-graph buckets, small
pools, routers, traces through the prefix cache) and the shipped serving configs. Every
output file must agree: decisions exactly, times to 1e-9 relative (the harness's rule).
Skipped when the tree has no fresh compiled build.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpkv import native
from tests.helpers.paths import CONFIGS, MOONCAKE_TRACE, REPO

SCENARIOS = 30
SHIPPED = (
    ["admit", str(CONFIGS / "serving.yaml")],
    ["admit", str(CONFIGS / "admit" / "serving_mooncake.yaml")],
    ["admit", str(CONFIGS / "admit" / "serving_disagg_mooncake.yaml")],
    ["admit", str(CONFIGS / "admit" / "serving_sglang.yaml")],
    ["admit", str(CONFIGS / "admit" / "serving_vllm.yaml")],
    ["admit", str(CONFIGS / "admit" / "vllm_queue.yaml")],
    ["admit", str(CONFIGS / "admit" / "seed004_iteration.yaml")],
    ["admit", str(CONFIGS / "admit" / "seed004_blocks.yaml")],
)

pytestmark = [
    pytest.mark.skipif(
        not native.built(), reason="no fresh compiled build of the serving engine in this tree"
    ),
    pytest.mark.skipif(  # (the random scenarios and most shipped configs read it)
        not MOONCAKE_TRACE.is_file(), reason=f"trace not found at {MOONCAKE_TRACE}"
    ),
]


def _golden():
    spec = importlib.util.spec_from_file_location("golden", REPO / "benchmarks" / "golden.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["golden"] = module
    spec.loader.exec_module(module)
    return module


def _run_all(commands: list[list[str]], out: Path, compiled: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CPKV_PLOTS": "0", "PYTHONHASHSEED": "0"}
    env.pop(native.PURE_ENV, None)
    if not compiled:
        env[native.PURE_ENV] = "1"
    out.mkdir()
    helper = REPO / "tests" / "helpers" / "run_many.py"
    subprocess.run(
        [sys.executable, "-P", str(helper), str(out), json.dumps(commands)],
        cwd=REPO, env=env, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return json.loads((out / "exit_codes.json").read_text())


def test_compiled_engine_decides_as_its_sources(tmp_path: Path) -> None:
    golden = _golden()
    items = golden.random_items(7, SCENARIOS, tmp_path / "scenarios")
    commands = [item.args for item in items] + [list(args) for args in SHIPPED]
    compiled = _run_all(commands, tmp_path / "compiled", True)
    source = _run_all(commands, tmp_path / "source", False)
    assert compiled["engine"] == "compiled"
    assert source["engine"].startswith("source")
    assert compiled["codes"] == source["codes"]
    assert compiled["codes"].count(0) >= SCENARIOS * 2 // 3 + len(SHIPPED) - 1
    tolerance = golden.Tolerance(1e-9, 1e-9)
    for i, code in enumerate(compiled["codes"]):
        if code != 0:
            continue
        ours = golden.run_dirs(tmp_path / "source" / str(i))
        theirs = golden.run_dirs(tmp_path / "compiled" / str(i))
        assert ours and len(ours) == len(theirs), commands[i]
        for a, b in zip(ours, theirs, strict=True):
            problems = golden.compare(golden.golden_files(a), golden.golden_files(b), tolerance)
            assert not problems, (commands[i], problems)
