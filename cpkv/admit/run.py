"""The ``admit`` kind's prepare: one config block, three capabilities.

* ``mode: serving`` -> :func:`cpkv.serving.run.prepare_serving` (time around any policy);
* ``mode: passes`` with ``engine: vllm`` -> :func:`cpkv.admit.vllm_passes.prepare_vllm_passes`
  (a queue through vLLM's scheduler, step by step);
* ``mode: passes`` with a block policy -> :func:`cpkv.policies.output.prepare_block_policy`;
* ``mode: passes`` with ``prefill_adder`` -> :func:`cpkv.admission.run.prepare_passes`.

Each is imported only when chosen, so ``cpkv admit`` pays only for what it runs.
"""

from __future__ import annotations

from collections.abc import Callable

from cpkv.admit.schema import AdmitConfig
from cpkv.core.kinds import RunContext
from cpkv.runs.results import RunOutput


def prepare(cfg: AdmitConfig) -> Callable[[RunContext], RunOutput]:
    """Dispatch a validated ``admit`` config to the capability that runs it."""
    block = cfg.admit
    if block.mode == "serving":  # time, arrivals, decode and KV around the policy
        from cpkv.serving.run import prepare_serving

        return prepare_serving(cfg)
    if block.engine == "vllm":  # a queue through vLLM's scheduler, step by step
        from cpkv.admit.vllm_passes import prepare_vllm_passes

        return prepare_vllm_passes(cfg)
    if block.policy != "prefill_adder":  # the block policies, one shot
        from cpkv.policies.output import prepare_block_policy

        return prepare_block_policy(block)
    from cpkv.admission.run import prepare_passes

    return prepare_passes(cfg)
