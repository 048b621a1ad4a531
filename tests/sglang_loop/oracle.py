"""The real SGLang 0.5.23 scheduler loop as a differential oracle: the shared loop driver
(``../shared/oracle/sglang_loop/drive.py``) in a subprocess that runs a whole list of
scenarios, since importing sglang takes about a minute. The harness extends the driver: it
passes the scenario's priority-scheduling server arguments and each request's ``priority``,
and records the requests preempted for a higher priority in each iteration (``preempted``;
SGLang collects them in a set, whose order the harness pins to the running batch's). ``compare`` diffs its output with
``cpkv.sglang``'s, iteration by iteration and field by field.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO.parent / "shared" / "oracle" / "sglang_loop" / "drive.py"
WALL_FIELDS = ("wall_s", "us_per_iteration")
RUNNER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sglang_loop_drive", sys.argv[1])
drive = importlib.util.module_from_spec(spec)
spec.loader.exec_module(drive)
from sglang.srt.managers.schedule_policy import PrefillAdder

# the driver does not pass priorities nor record priority preemptions: wrap it
PRIORITY_KEYS = ("enable_priority_scheduling", "schedule_low_priority_values_first",
                 "priority_scheduling_preemption_threshold", "retraction_policy")
EXTRA, PREEMPTED = {}, []
server_args = drive.ServerArgs
drive.ServerArgs = lambda **kw: server_args(**kw, **EXTRA)
make_req = drive.LoopScheduler._make_req
def _make_req(self, i, r, cached):
    t, k, req = make_req(self, i, r, cached)
    req.priority = r.get("priority")
    return t, k, req
drive.LoopScheduler._make_req = _make_req
run_batch = drive.LoopScheduler.run_batch
def _run_batch(self, batch, pp_proxy_tensors=None):
    res = run_batch(self, batch, pp_proxy_tensors)
    self.trace[-1]["preempted"] = list(PREEMPTED)
    PREEMPTED.clear()
    return res
drive.LoopScheduler.run_batch = _run_batch
preempt = PrefillAdder.preempt_to_schedule
def _preempt(self, req):
    before, n = list(self.running_batch.reqs), len(self.preempt_list)
    done = preempt(self, req)
    # SGLang extends its list from a set (an order of memory addresses): pin it to the
    # running batch's order
    new = sorted(self.preempt_list[n:], key=before.index)
    self.preempt_list[n:] = new
    PREEMPTED.extend(r.rid for r in new)
    return done
PrefillAdder.preempt_to_schedule = _preempt

out = []
for sc in json.load(open(sys.argv[2])):
    EXTRA.clear()
    EXTRA.update({k: sc[k] for k in PRIORITY_KEYS if k in sc})
    PREEMPTED.clear()
    try:
        out.append(drive.run_scenario(sc))
    except Exception as exc:  # the real loop refused or failed: compared as such
        out.append({"error": f"{type(exc).__name__}: {exc}"})
json.dump(out, open(sys.argv[3], "w"))
"""


def missing() -> str | None:
    """Why the oracle cannot run here, or None when it can."""
    if not DRIVER.is_file():
        return f"the SGLang loop oracle driver is not here ({DRIVER}: ../shared is missing)"
    if importlib.util.find_spec("sglang") is None:
        return (
            "sglang is not importable in this python; run with the oracle venv: "
            "bash scripts/oracle_venv.sh && .oracle-venv/bin/python -m pytest -m sglang"
        )
    return None


def run_real(scenarios: list[dict], python: str | None = None, timeout: float = 1500) -> list[dict]:
    """Run scenarios through the real SGLang loop (one subprocess for the whole list)."""
    with tempfile.TemporaryDirectory() as tmp:
        batch, out = Path(tmp) / "batch.json", Path(tmp) / "out.json"
        batch.write_text(json.dumps(scenarios))
        proc = subprocess.run(
            [python or sys.executable, "-c", RUNNER, str(DRIVER), str(batch), str(out)],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"drive.py failed ({proc.returncode}): {proc.stderr[-2000:]}")
        results = json.loads(out.read_text())
    for r in results:
        for key in WALL_FIELDS:
            r.pop(key, None)
    return results


def compare(model: dict, real: dict) -> list[str]:
    """Every difference between two runs of one scenario (model first), as lines."""
    if "error" in real:
        return [f"the real loop failed: {real['error']}"]
    model = json.loads(json.dumps(model))
    out = []
    if len(model["trace"]) != len(real["trace"]):
        out.append(f"iterations: {len(model['trace'])} vs {len(real['trace'])}")
    for mine, theirs in zip(model["trace"], real["trace"], strict=False):
        if mine != theirs:
            for key in sorted(set(mine) | set(theirs)):
                if mine.get(key) != theirs.get(key):
                    out.append(f"it {theirs['it']} {key}: {mine.get(key)!r} vs {theirs.get(key)!r}")
    for rid in sorted(set(model["requests"]) | set(real["requests"])):
        a, b = model["requests"].get(rid), real["requests"].get(rid)
        if a != b:
            out.append(f"request {rid}: {a} vs {b}")
    for key in ("end_ms", "final"):
        if model[key] != real[key]:
            out.append(f"{key}: {model[key]} vs {real[key]}")
    return out


def coverage(scenarios: list[dict], results: list[dict]) -> dict[str, int]:
    """How many scenarios (of the real runs) exercise each rule the test is meant to cover."""

    def count(pred) -> int:
        return sum(1 for r in results if "trace" in r and pred(r["trace"]))

    def readmitted(trace: list[dict]) -> bool:
        out: set[str] = set()
        for t in trace:
            if any(rid in out for rid, _, _ in t["extend"]):
                return True
            out.update(t["retracted"])
        return False

    def first_rows_hit(trace: list[dict]) -> bool:
        seen: set[str] = set()
        for t in trace:
            for rid, prefix, _ in t["extend"]:
                if rid not in seen and prefix > 0:
                    return True
                seen.add(rid)
        return False

    def evicted(trace: list[dict]) -> bool:
        return any(
            b["evictable"] < a["evictable"] and b["protected"] <= a["protected"]
            for a, b in zip(trace, trace[1:], strict=False)
        )

    def out_of_arrival_order(scenario: dict, trace: list[dict]) -> bool:
        arrival = {
            q["rid"]: (q.get("arrival_ms", 0), i) for i, q in enumerate(scenario["requests"])
        }
        firsts: list[str] = []
        for t in trace:
            firsts += [rid for rid, _, _ in t["extend"] if rid not in firsts]
        return any(arrival[a] > arrival[b] for a, b in zip(firsts, firsts[1:], strict=False))

    def reordered(policy: str) -> int:
        return sum(
            1
            for s, r in zip(scenarios, results, strict=True)
            if s.get("schedule_policy") == policy
            and not s.get("disable_radix_cache")
            and "trace" in r
            and out_of_arrival_order(s, r["trace"])
        )

    def idle(trace: list[dict]) -> bool:
        return any(b["t_ms"] - a["t_ms"] > 50 for a, b in zip(trace, trace[1:], strict=False))

    return {
        "retraction": count(lambda tr: any(t["retracted"] for t in tr)),
        "priority_preemption": count(lambda tr: any(t.get("preempted") for t in tr)),
        "readmitted_after_retraction": count(readmitted),
        "prefix_hit": count(first_rows_hit),
        "eviction": count(evicted),
        "chunked": count(lambda tr: any(t["chunked"] for t in tr)),
        "mixed_batch": count(lambda tr: any(t["kind"] == "mixed" for t in tr)),
        "prefill_stalls_decodes": count(
            lambda tr: any(t["kind"] == "prefill" and t["running"] > 0 for t in tr)
        ),
        "no_token_latch": count(
            lambda tr: any(t["kind"] == "decode" and t["waiting"] > 0 for t in tr)
        ),
        "overlap": sum(1 for s in scenarios if s.get("overlap")),
        "page_size_over_1": sum(1 for s in scenarios if s.get("page_size", 1) > 1),
        "radix_off": sum(1 for s in scenarios if s.get("disable_radix_cache")),
        "ignore_eos": sum(1 for s in scenarios if any(q.get("ignore_eos") for q in s["requests"])),
        "idle_gap": count(idle),
        "hrrn_reorders": reordered("hrrn"),
        "shortest_prefill_first_reorders": reordered("shortest-prefill-first"),
        "dfs_weight_reorders": reordered("dfs-weight"),
    }
