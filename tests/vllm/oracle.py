"""The real vLLM 0.32.0 scheduler as a differential oracle: the shared driver in a subprocess.

``../shared/oracle/vllm/drive.py`` (beside this checkout) builds the real ``Scheduler`` with
its ``KVCacheManager`` and runs the JSON scenario format step by step; one subprocess runs a
whole batch, since importing vLLM takes most of a minute. ``compare`` diffs its output with
``cpkv.vllm``'s, step by step and field by field.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO.parent / "shared" / "oracle" / "vllm" / "drive.py"
CACHE_DIR = REPO / ".vllm-oracle-cache"
TIMING_FIELDS = ("sched_us", "update_us")


def missing() -> str | None:
    """Why the oracle cannot run here, or None when it can."""
    if not DRIVER.is_file():
        return f"the vLLM oracle driver is not here ({DRIVER}: ../shared is missing)"
    if importlib.util.find_spec("vllm") is None:
        return (
            "vllm is not importable in this python; run with the vLLM venv: "
            "bash scripts/vllm_venv.sh && .vllm-venv/bin/python -m pytest -m vllm tests/vllm"
        )
    return None


def run_real(scenarios: list[dict], timeout: float = 900) -> list[dict]:
    """Run scenarios through the real vLLM scheduler (one subprocess for the whole batch)."""
    env = {**os.environ, "VLLM_ORACLE_DIR": str(CACHE_DIR)}
    with tempfile.TemporaryDirectory() as tmp:
        batch, out = Path(tmp) / "batch.json", Path(tmp) / "out.json"
        batch.write_text(json.dumps(scenarios))
        proc = subprocess.run(
            [sys.executable, str(DRIVER), str(batch), "-o", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"drive.py failed ({proc.returncode}): {proc.stderr[-2000:]}")
        results = json.loads(out.read_text())
    return results if isinstance(results, list) else [results]


def _strip(step: dict) -> dict:
    return {k: v for k, v in step.items() if k not in TIMING_FIELDS}


def compare(model: dict, real: dict) -> list[str]:
    """Every difference between two runs of one scenario (model first), as lines."""
    model = json.loads(json.dumps(model))
    out = []
    if model["config"] != real["config"]:
        out.append(f"config: {model['config']} vs {real['config']}")
    if len(model["steps"]) != len(real["steps"]):
        out.append(f"steps: {len(model['steps'])} vs {len(real['steps'])}")
    for mine, theirs in zip(model["steps"], real["steps"], strict=False):
        theirs = _strip(theirs)
        if mine != theirs:
            for key in sorted(set(mine) | set(theirs)):
                if mine.get(key) != theirs.get(key):
                    out.append(
                        f"step {theirs['step']} {key}: {mine.get(key)!r} vs {theirs.get(key)!r}"
                    )
    if model["requests"] != real["requests"]:
        for rid in sorted(set(model["requests"]) | set(real["requests"])):
            a, b = model["requests"].get(rid), real["requests"].get(rid)
            if a != b:
                out.append(f"request {rid}: {a} vs {b}")
    return out


def coverage(scenarios: list[dict], results: list[dict]) -> dict[str, int]:
    """How many scenarios (of the real runs) exercise each rule the test is meant to cover."""

    def count(pred) -> int:
        return sum(1 for r in results if any(pred(s) for s in r["steps"] if not s.get("idle")))

    return {
        "preemption": count(lambda s: s["preempted"]),
        "resumed_with_hit": count(lambda s: any(e["computed"] > 0 for e in s["resumed"])),
        "resumed_without_hit": count(lambda s: any(e["computed"] == 0 for e in s["resumed"])),
        "prefix_hit_new": count(lambda s: any(e["computed"] > 0 for e in s["new"])),
        "stop_kv_blocks": count(lambda s: s["waiting_stop"] == "kv_blocks"),
        "stop_token_budget": count(lambda s: s["waiting_stop"] == "token_budget"),
        "stop_max_num_seqs": count(lambda s: s["waiting_stop"] == "max_num_seqs"),
        "self_preemption_empty_step": count(
            lambda s: s["preempted"] and s["total_tokens"] == 0 and s["queue_running"]
        ),
        "several_victims_one_step": count(lambda s: len(s["preempted"]) > 1),
        "chunked": count(lambda s: any(e["n"] > 1 and e["computed"] > 0 for e in s["running"])),
        "idle_step": sum(1 for r in results if any(s.get("idle") for s in r["steps"])),
        "max_model_len_stop": sum(
            1
            for scn, r in zip(scenarios, results, strict=True)
            if any(
                r["requests"][str(q["id"])]["finish_step"] is not None
                and r["requests"][str(q["id"])]["output_tokens"] < q["max_tokens"]
                for q in scn["requests"]
            )
        ),
        "priority": sum(1 for r in results if r["config"]["policy"] == "priority"),
        "no_prefix_caching": sum(1 for r in results if not r["config"]["enable_prefix_caching"]),
    }
