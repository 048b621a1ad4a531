"""vLLM 0.32.0's V1 scheduler, modelled decision for decision, in pure Python (no vllm, no torch).

Holds: ``config`` (the scheduler knobs under vLLM's names, with vLLM's defaults), ``request``
(a request's tokens, state and block-hash chain), ``block_pool`` (KV blocks, the free queue in
eviction order, the prefix-cache map and the chained block keys), ``kv_cache`` (the KV cache
manager: prefix hits, slot allocation with the full-prompt gate and the watermark, freeing),
``queue`` (the fcfs and priority waiting queues), ``scheduler`` (one ``schedule()`` step and
one ``update()``: running first, then waiting, with preemption), ``scenario`` (the JSON
scenario format of the vLLM oracle: requests, defaults, prompts, the step loop and its per-step
records).

Mirrors ``vllm.v1.core.sched.scheduler.Scheduler`` of vLLM 0.32.0 for a text-only model with
one full-attention KV cache group. Out of scope: speculative decoding, async scheduling, KV
connectors, LoRA, multimodal inputs, hybrid KV groups, sub-block prefix hits, streaming input.

May import: nothing of cpkv (the standard library only).
"""

from cpkv.vllm.config import SchedulerConfig
from cpkv.vllm.scenario import VLLM_VERSION, run_scenario, run_scenarios
from cpkv.vllm.scheduler import Scheduler, StepPlan

__all__ = [
    "VLLM_VERSION",
    "Scheduler",
    "SchedulerConfig",
    "StepPlan",
    "run_scenario",
    "run_scenarios",
]
