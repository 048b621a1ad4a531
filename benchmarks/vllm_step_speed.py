"""Per-step cost of cpkv.vllm against the real vLLM 0.32.0 scheduler, same scenarios, one process.

Usage (in the vLLM venv of scripts/vllm_venv.sh, with ../shared beside the checkout):

    .vllm-venv/bin/python benchmarks/vllm_step_speed.py [--requests N] [--small K]

The real side is the shared oracle driver (``../shared/oracle/vllm/drive.py``, loaded into this
process): its per-step timings of ``schedule()`` + ``update_from_output()``. The model side
times ``Scheduler.schedule()`` + ``Scheduler.update()`` the same way, on the same requests, in
the same loop order; a full ``run_scenario`` (records included) is timed too. Workloads: the
driver's bench workload (8 shared system prompts, 64..1500-token prompts, about 2 arrivals per
step) with a roomy pool, then a tight pool under fcfs and priority (preemption-heavy), then K
small scenarios of the differential test. Each case also checks that the two runs' per-step
records are equal. Printed: steps, mean and median microseconds per step on each side, and the
ratio of the means (real / model; the target is at least 50).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO.parent / "shared" / "oracle" / "vllm" / "drive.py"
sys.path.insert(0, str(REPO))

from cpkv.vllm import Scheduler, SchedulerConfig, run_scenario  # noqa: E402
from cpkv.vllm.request import Request  # noqa: E402
from cpkv.vllm.scenario import prompt_tokens, scenario_config  # noqa: E402


def load_driver():
    os.environ.setdefault("VLLM_ORACLE_DIR", str(REPO / ".vllm-oracle-cache"))
    spec = importlib.util.spec_from_file_location("vllm_oracle_drive", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_step_us(scenario: dict) -> list[float]:
    """Microseconds of schedule() + update() for each non-idle step of the scenario."""
    sched = Scheduler(SchedulerConfig(**scenario_config(scenario)))
    arrivals: dict[int, list[tuple[int, dict]]] = {}
    for index, spec in enumerate(scenario["requests"]):
        arrivals.setdefault(int(spec.get("arrival", 0)), []).append((index, spec))
    last = max(arrivals)
    out = []
    clock = time.perf_counter
    for step in range(int(scenario.get("max_steps", 10000))):
        for index, spec in arrivals.get(step, ()):
            sched.add_request(
                Request(
                    str(spec["id"]),
                    index,
                    prompt_tokens(spec),
                    int(spec.get("max_tokens", 16)),
                    int(spec.get("priority", 0)),
                    float(spec.get("arrival", 0)) + index * 1e-6,
                )
            )
        if step > last and not sched.has_requests():
            break
        if not sched.has_requests():
            continue
        start = clock()
        sched.update(sched.schedule())
        out.append((clock() - start) * 1e6)
    return out


def records_equal(model: dict, real: dict) -> bool:
    strip = ("sched_us", "update_us")
    real_steps = [{k: v for k, v in s.items() if k not in strip} for s in real["steps"]]
    import json

    return (
        json.loads(json.dumps(model["steps"])) == real_steps
        and model["requests"] == real["requests"]
    )


def case(name: str, scenarios: list[dict], drive) -> tuple[float, float]:
    real_us, model_us, full_s, equal = [], [], 0.0, True
    for scn in scenarios:
        real = drive.run_scenario(scn)
        real_us += [s["sched_us"] + s["update_us"] for s in real["steps"] if not s.get("idle")]
        model_us += model_step_us(scn)
        start = time.perf_counter()
        model = run_scenario(scn)
        full_s += time.perf_counter() - start
        equal = equal and records_equal(model, real)
    n = len(real_us)
    real_mean, model_mean = statistics.fmean(real_us), statistics.fmean(model_us)
    print(
        f"{name:28s} {n:7d} {real_mean:10.1f} {statistics.median(real_us):10.1f} "
        f"{model_mean:9.1f} {statistics.median(model_us):9.1f} {full_s / n * 1e6:9.1f} "
        f"{real_mean / model_mean:7.1f}x  {'yes' if equal else 'NO'}"
    )
    return real_mean * n, model_mean * n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="bench workload size")
    parser.add_argument("--small", type=int, default=100, help="differential scenarios")
    args = parser.parse_args()
    if not DRIVER.is_file():
        sys.exit(f"vllm_step_speed: the oracle driver is not here ({DRIVER})")
    start = time.perf_counter()
    drive = load_driver()
    drive.run_scenario(drive.SELFTEST[0])  # import vLLM and build its model config once
    print(f"vLLM {drive.V['vllm_version']} loaded in {time.perf_counter() - start:.0f}s")
    from tests.vllm.scenarios import make_scenarios

    cases = []
    roomy = drive.make_bench(args.requests)
    cases.append((f"bench {args.requests} roomy fcfs", [roomy]))
    for policy in ("fcfs", "priority"):
        tight = drive.make_bench(args.requests * 2 // 3, pool_blocks=300)
        tight["config"]["policy"] = policy
        cases.append((f"bench {args.requests * 2 // 3} pool 300 {policy}", [tight]))
    cases.append((f"{args.small} differential scenarios", make_scenarios(args.small, seed=1)))
    print(
        f"{'case':28s} {'steps':>7s} {'real mean':>10s} {'real med':>10s} {'model mean':>9s} "
        f"{'model med':>9s} {'model+rec':>9s} {'ratio':>8s}  same records"
    )
    total_real = total_model = 0.0
    for name, scenarios in cases:
        r, m = case(name, scenarios, drive)
        total_real += r
        total_model += m
    print(
        f"all steps: real {total_real / 1e6:.2f}s, model {total_model / 1e6:.3f}s, "
        f"ratio {total_real / total_model:.1f}x (µs per step: schedule + update)"
    )


if __name__ == "__main__":
    main()
