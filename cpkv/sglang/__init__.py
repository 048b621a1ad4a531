"""SGLang 0.5.23's scheduler loop, modelled iteration for iteration, in pure Python (no sglang,
no torch).

Holds: ``config`` (the server arguments the loop reads, under SGLang's names and defaults),
``request`` (a request's scheduling state), ``radix`` (the radix cache: match, insert, locks,
LRU eviction), ``memory`` (the KV pool's free pages and the request pool's rows), ``adder``
(the ``PrefillAdder`` of one pass), ``loop`` (the normal and the overlap event loop:
``get_next_batch_to_run``, prefill before decode, mixed chunks, the ``batch_is_full`` latch,
retraction, the new-token ratio, result processing), ``listener`` (what the loop tells its
caller), ``scenario`` (the SGLang loop oracle's scenario format and its per-iteration records).

Mirrors ``sglang.srt.managers.scheduler.Scheduler`` of SGLang 0.5.23 for a text-only model with
one full-attention KV pool. Out of scope: HiCache and storage tiers (cpkv adds its own on top),
speculative decoding, DP attention, pipeline parallelism, disaggregation, LoRA, multimodal
inputs, hybrid SWA / Mamba pools, priority preemption, the prefill delayer, EOS and stop
strings (a request ends at ``max_new_tokens``).

May import: nothing of cpkv (the standard library only).
"""

from cpkv.sglang.config import LoopConfig
from cpkv.sglang.listener import Listener
from cpkv.sglang.loop import Batch, Loop
from cpkv.sglang.request import Req
from cpkv.sglang.scenario import SGLANG_VERSION, run_scenario, run_scenarios

__all__ = [
    "SGLANG_VERSION",
    "Batch",
    "Listener",
    "Loop",
    "LoopConfig",
    "Req",
    "run_scenario",
    "run_scenarios",
]
