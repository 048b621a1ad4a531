"""The iteration block policy: a per-iteration token budget, decodes first, the prompt chunked.

Every iteration (tick) has ``budget_tokens`` units of token-work. Each of the
``decode_requests`` running requests advances one token first; what is left of the
budget, capped by ``chunk_tokens`` and by what is left of the prompt, goes to one
prefill chunk of the long prompt. Ticks repeat until the prompt is fully prefilled.
Tokens are equal-cost here (a teaching model, not a cost model).

Where the ticks would never finish the prompt (a prompt left while no prefill token fits a
tick: ``chunk_tokens <= 0`` or ``budget_tokens <= decode_requests``), :func:`iteration_trace`
raises :class:`~cpkv.core.errors.ConfigError` naming the cause instead of looping forever.
Negative counts are rejected too.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpkv.core.errors import ConfigError
from cpkv.core.schema import FieldError, require
from cpkv.core.schema.keys import check_bounds
from cpkv.core.schema.limits import Tokens
from cpkv.policies.budgets import TokenWeights
from cpkv.runs.results import metric


@dataclass(frozen=True)
class IterationBudget:
    """The ``admit.iteration`` block: one long prompt chunked beside running decodes."""

    budget_tokens: Tokens = 6
    decode_requests: Tokens = 2
    prompt_tokens: Tokens = 12
    chunk_tokens: Tokens = 4
    # mode serving (cpkv.policies.budgets): budget units per token kind, and the draft tokens
    # each decoding request verifies per iteration
    weights: TokenWeights = TokenWeights()
    verify_tokens: Tokens = 0

    def validate(self) -> None:
        """Raise :class:`~cpkv.core.schema.FieldError` (key relative to the block) if unusable."""
        check_bounds(self)
        if self.prompt_tokens == 0:
            return  # nothing to prefill: an empty trace, whatever the budget
        require(
            self.chunk_tokens > 0,
            "chunk_tokens",
            f"must be > 0 to prefill a {self.prompt_tokens}-token prompt "
            "(0 would never make progress)",
        )
        require(
            self.budget_tokens > self.decode_requests,
            "budget_tokens",
            f"{self.budget_tokens} leaves no room for prefill after "
            f"{self.decode_requests} decode tokens per tick (decode first); "
            f"need budget_tokens > decode_requests or the prompt never finishes",
        )

    @property
    def prefill_tokens_per_tick(self) -> int:
        """Prefill tokens a full tick carries: the budget left after decodes, chunk-capped."""
        return min(
            self.chunk_tokens, self.budget_tokens - min(self.decode_requests, self.budget_tokens)
        )


@dataclass(frozen=True)
class IterationTick:
    """One iteration: token-work spent on decodes and on the prompt chunk, prompt left after."""

    tick: int
    decode_tokens: int = metric(unit="tokens", lower_is_better=False)
    prefill_tokens: int = metric(unit="tokens", lower_is_better=False)
    remaining_prompt_tokens: int = metric(unit="tokens")


def iteration_trace(
    budget: IterationBudget, key: str = "admit.iteration"
) -> tuple[IterationTick, ...]:
    """The tick-by-tick trace until the prompt is prefilled (empty when there is no prompt).

    Raises :class:`~cpkv.core.errors.ConfigError` (naming ``key`` + field) for inputs on which
    the ticks would never finish the prompt.
    """
    try:
        budget.validate()
    except FieldError as err:
        raise ConfigError(f"{key}.{err.key}: {err.detail}") from None
    decode = min(budget.decode_requests, budget.budget_tokens)
    per_tick = budget.prefill_tokens_per_tick
    ticks = -(-budget.prompt_tokens // per_tick) if budget.prompt_tokens else 0
    trace = []
    for tick in range(ticks):
        done = min(budget.prompt_tokens, (tick + 1) * per_tick)
        prefill = done - min(budget.prompt_tokens, tick * per_tick)
        trace.append(IterationTick(tick, decode, prefill, budget.prompt_tokens - done))
    return tuple(trace)
