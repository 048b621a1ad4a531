"""The vLLM oracle's JSON scenario format, run through the model step by step.

A scenario is ``{"name", "config": {...}, "num_steps" | "max_steps", "requests": [...]}``.
``config`` takes vLLM's knob names; what it leaves out takes the scenario format's defaults
(``SCENARIO_DEFAULTS``, not vLLM's), and ``max_model_len`` defaults to the longest
prompt + ``max_tokens`` (or the budget, or the long-prefill cap, if larger) rounded up to 1024.
A request gives ``id``, ``arrival`` (a step), ``max_tokens`` (default 16), ``priority``
(default 0) and one of ``prompt`` (token ids), ``segments`` (``[[name, length], ...]``: the same
name gives the same tokens, so shared prefixes hit) or ``prompt_len`` (tokens of its own).

The loop, step k: add the requests arriving at k (``arrival_time = k + index * 1e-6``); when
the engine has nothing to do record an idle step (or stop, with ``max_steps``, once every
request has arrived); otherwise ``schedule()``, record, feed one token back to each request
whose prefill completed, record the update. Per step: ``new``, ``resumed`` and ``running``
(``{id, n, computed}``), ``preempted``, ``total_tokens``, ``token_budget_left``,
``waiting_stop``, ``alloc_fail``, ``free_blocks_after_schedule``, ``queue_running``,
``queue_waiting``, ``finished``, ``free_blocks_after_update``, ``num_computed``. Per request:
``arrival``, ``prompt_len``, ``first_sched_step``, ``prefix_hit_tokens``, ``num_preemptions``,
``finish_step``, ``output_tokens``.

``waiting_stop`` says what ended admission, checked in this order: ``preempted_this_step``
(admission is skipped), ``queue_empty``, ``kv_blocks`` (the last admission's slots did not
fit), ``token_budget``, ``max_num_seqs``, ``other``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from cpkv.vllm.config import SchedulerConfig
from cpkv.vllm.request import Request
from cpkv.vllm.scheduler import Scheduler, StepPlan, admission_stop

VLLM_VERSION = "0.32.0"

SCENARIO_DEFAULTS: dict[str, Any] = {
    "block_size": 16,
    "num_gpu_blocks": 10000,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 8192,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "max_model_len": None,
    "scheduler_reserve_full_isl": True,
    "watermark": 0.0,
    "max_num_active_seqs": None,
    "long_prefill_token_threshold_adaptive": False,
}
DEFAULT_MAX_TOKENS = 16
DEFAULT_MAX_STEPS = 10000


def segment_tokens(name: str, length: int) -> list[int]:
    """The tokens of a named segment: a run of consecutive ids from a base the name fixes."""
    digest = int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)
    start = 10_000 + (digest % 1_000_000) * 1000
    return list(range(start, start + length))


def prompt_tokens(spec: dict) -> list[int]:
    """A request's prompt from its ``prompt``, ``segments`` or ``prompt_len``."""
    if "prompt" in spec:
        return [int(t) for t in spec["prompt"]]
    if "segments" in spec:
        tokens: list[int] = []
        for name, length in spec["segments"]:
            tokens.extend(segment_tokens(str(name), int(length)))
        return tokens
    if "prompt_len" in spec:
        return segment_tokens(f"__unique__{spec['id']}", int(spec["prompt_len"]))
    raise ValueError(f"request {spec.get('id')!r}: needs prompt, segments or prompt_len")


def scenario_config(scenario: dict) -> dict[str, Any]:
    """The scenario's config with the format's defaults filled in (``max_model_len`` too)."""
    given = scenario.get("config", {})
    unknown = set(given) - set(SCENARIO_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown config keys: {sorted(unknown)}")
    config = {**SCENARIO_DEFAULTS, **given}
    if config["max_model_len"] is None:
        longest = max(
            [
                len(prompt_tokens(r)) + int(r.get("max_tokens", DEFAULT_MAX_TOKENS))
                for r in scenario["requests"]
            ]
            + [config["max_num_batched_tokens"], config["long_prefill_token_threshold"], 1]
        )
        config["max_model_len"] = -(-longest // 1024) * 1024
    return config


def _entries(entries: list[tuple[str, int, int]]) -> list[dict]:
    return [{"id": i, "n": n, "computed": c} for i, n, c in entries]


def plan_record(sched: Scheduler, plan: StepPlan) -> dict[str, Any]:
    """What one ``schedule()`` decided, as the oracle records it: the scheduled new, resumed
    and running requests (``{id, n, computed}``), the preempted ones, the tokens scheduled
    and the budget left, what stopped admission, the allocations that failed, the free
    blocks after the schedule."""
    return {
        "new": _entries(plan.new_entries()),
        "resumed": _entries(plan.resumed_entries()),
        "running": _entries(plan.running_entries()),
        "preempted": plan.preempted,
        "total_tokens": plan.total_tokens,
        "token_budget_left": sched.config.max_num_batched_tokens - plan.total_tokens,
        "waiting_stop": admission_stop(sched, plan),
        "alloc_fail": [{"id": i, "phase": p, "n": n, "ok": False} for i, p, n in plan.failed],
        "free_blocks_after_schedule": sched.free_blocks,
    }


def run_scenario(scenario: dict) -> dict:
    """Run one scenario through the model: ``{name, vllm_version, config, steps, requests}``."""
    specs = scenario["requests"]
    config_dict = scenario_config(scenario)
    sched = Scheduler(SchedulerConfig(**config_dict))

    arrivals: dict[int, list[tuple[int, dict]]] = {}
    for index, spec in enumerate(specs):
        arrivals.setdefault(int(spec.get("arrival", 0)), []).append((index, spec))
    last_arrival = max(arrivals) if arrivals else 0
    summary = {
        str(s["id"]): {
            "arrival": int(s.get("arrival", 0)),
            "prompt_len": None,
            "first_sched_step": None,
            "prefix_hit_tokens": None,
            "num_preemptions": 0,
            "finish_step": None,
            "output_tokens": 0,
        }
        for s in specs
    }
    num_steps = scenario.get("num_steps")
    limit = (
        int(scenario.get("max_steps", DEFAULT_MAX_STEPS)) if num_steps is None else int(num_steps)
    )

    steps: list[dict] = []
    for step in range(limit):
        arrived = []
        for index, spec in arrivals.get(step, ()):
            request = Request(
                str(spec["id"]),
                index,
                prompt_tokens(spec),
                int(spec.get("max_tokens", DEFAULT_MAX_TOKENS)),
                int(spec.get("priority", 0)),
                float(spec.get("arrival", 0)) + index * 1e-6,
            )
            summary[request.request_id]["prompt_len"] = request.num_prompt_tokens
            sched.add_request(request)
            arrived.append(request.request_id)
        if num_steps is None and step > last_arrival and not sched.has_requests():
            break
        record: dict[str, Any] = {"step": step, "arrived": arrived}
        if not sched.has_requests():
            record["idle"] = True
            steps.append(record)
            continue

        record.update(_step(sched, summary, step))
        steps.append(record)

    return {
        "name": scenario.get("name"),
        "vllm_version": VLLM_VERSION,
        "config": config_dict,
        "steps": steps,
        "requests": summary,
    }


def _step(sched: Scheduler, summary: dict[str, dict], step: int) -> dict[str, Any]:
    """One ``schedule()`` and ``update()``: the step's record (but its number and arrivals);
    the requests' summaries updated."""
    plan = sched.schedule()
    for request_id, _, computed in plan.new_entries() + plan.resumed_entries():
        s = summary[request_id]
        if s["first_sched_step"] is None:
            s["first_sched_step"] = step
            s["prefix_hit_tokens"] = computed
    for request_id in plan.preempted:
        summary[request_id]["num_preemptions"] += 1
    record = plan_record(sched, plan)
    record["queue_running"] = [r.request_id for r in sched.running]
    record["queue_waiting"] = [r.request_id for r in sched.waiting]
    requests = sched.requests
    emitted = [
        request_id
        for request_id in plan.num_scheduled
        if requests[request_id].num_computed_tokens >= requests[request_id].num_tokens
    ]
    finished = sched.update(plan)
    for request_id in emitted:
        summary[request_id]["output_tokens"] += 1
    for request_id in finished:
        summary[request_id]["finish_step"] = step
    record["finished"] = sorted(finished)
    record["free_blocks_after_update"] = sched.free_blocks
    record["num_computed"] = {i: r.num_computed_tokens for i, r in sched.requests.items()}
    return record


def run_scenarios(scenarios: list[dict]) -> list[dict]:
    """Run a batch of scenarios, one fresh engine each."""
    return [run_scenario(s) for s in scenarios]
