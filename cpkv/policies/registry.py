"""The admission policies of ``admit.policy``: SGLang's PrefillAdder and the block policies.

``POLICIES`` maps each YAML name to a :class:`PolicySpec`:

* ``prefill_adder`` - SGLang's PrefillAdder; it runs through the tick model
  (``cpkv.admission.adder``), so its spec has no ``run`` here: callers dispatch to that
  model when ``spec.run is None``;
* ``iteration`` - the per-iteration token budget (:mod:`cpkv.policies.iteration`), reads
  ``admit.iteration`` and no requests;
* ``conservative`` - reserve the maximum blocks at admission (:mod:`cpkv.policies.blocks`);
* ``optimistic`` - admit on prompt blocks, preempt on growth (:mod:`cpkv.policies.growth`);
  both read ``admit.kv`` and block requests (``rid``, ``prompt_tokens``, ``max_new_tokens``);
* ``profiled`` - cpkv's: reserve the prompt plus a quantile of the output lengths seen so
  far (:mod:`cpkv.policies.profiled`); it needs finished requests, so it runs only in the
  serving simulation (``serving_only``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cpkv.core.errors import ConfigError
from cpkv.core.registry import Registry
from cpkv.policies.blocks import BlockOutcome, BlockRequest, KvBlocks, conservative
from cpkv.policies.growth import optimistic
from cpkv.policies.iteration import IterationBudget, IterationTick, iteration_trace


@dataclass(frozen=True)
class BlockPolicyInputs:
    """Everything a block policy (iteration, conservative, optimistic) may read."""

    kv: KvBlocks = KvBlocks()
    iteration: IterationBudget = IterationBudget()
    requests: tuple[BlockRequest, ...] = ()


PolicyResult = BlockOutcome | tuple[IterationTick, ...]


@dataclass(frozen=True)
class PolicySpec:
    """One admission policy: what it reads and how to run it (``None``: the tick model)."""

    name: str
    reads: Literal["prefill_requests", "iteration", "block_requests"]
    run: Callable[[BlockPolicyInputs], PolicyResult] | None
    help: str
    serving_only: bool = False


POLICIES: Registry[PolicySpec] = Registry("admission policy")

for _spec in (
    PolicySpec(
        "prefill_adder", "prefill_requests", None, "SGLang PrefillAdder model (the tick model)"
    ),
    PolicySpec(
        "iteration",
        "iteration",
        lambda s: iteration_trace(s.iteration),
        "per-iteration token budget, decode first, chunked prompt",
    ),
    PolicySpec(
        "conservative",
        "block_requests",
        lambda s: conservative(s.requests, s.kv),
        "reserve ceil((prompt + max_new) / block) blocks",
    ),
    PolicySpec(
        "optimistic",
        "block_requests",
        lambda s: optimistic(s.requests, s.kv),
        "admit on prompt blocks, preempt when growth does not fit",
    ),
    PolicySpec(
        "profiled",
        "block_requests",
        None,
        "cpkv: reserve prompt + a quantile of the output lengths seen so far (mode serving)",
        serving_only=True,
    ),
):
    POLICIES.register(_spec.name, _spec, help=_spec.help)


def run_block_policy(name: str, inputs: BlockPolicyInputs) -> PolicyResult:
    """Run block policy ``name``; ConfigError if unknown or if it is the tick model's."""
    try:
        spec = POLICIES.get(name)
    except ConfigError as err:
        raise ConfigError(f"admit.policy: {err}") from None
    if spec.serving_only:
        raise ConfigError(f"admit.policy: {name!r} runs only with admit.mode serving")
    if spec.run is None:
        raise ConfigError(
            f"admit.policy: {name!r} runs through the PrefillAdder tick model, not the block policies"
        )
    return spec.run(inputs)


def block_policy_names() -> list[str]:
    """Names of the policies this module runs itself."""
    return [
        n
        for n in POLICIES.names()
        if POLICIES.get(n).run is not None and not POLICIES.get(n).serving_only
    ]
