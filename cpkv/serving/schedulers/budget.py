"""The per-iteration token budget of the block policies (``admit.iteration``): what the
prefill rows of an iteration may compute.

``budget_tokens`` minus one token per decoding request (or, with ``admit.iteration.weights``
/ ``verify_tokens``, :func:`~cpkv.policies.budgets.weighted_prefill_budget`) goes to the
prefilling requests' prompts, oldest admission first, at most ``chunk_tokens`` per request
per iteration (:func:`chunks`).
"""

from __future__ import annotations

from typing import Any

from cpkv.policies.budgets import TokenWeights, weighted_prefill_budget


class TokenBudget:
    """The budget rule of one run (module docstring)."""

    def __init__(self, settings: Any) -> None:
        self.budget_tokens, self.chunk_tokens = settings.budget_tokens, settings.chunk_tokens
        opts = settings.options
        self.weights = TokenWeights() if opts is None else opts.weights
        self.verify_tokens = 0 if opts is None else opts.verify_tokens
        self.weighted = not self.weights.is_default or bool(self.verify_tokens)

    def prefill_tokens(self, decoded: int) -> int:
        """Prefill tokens an iteration that decodes ``decoded`` tokens may carry."""
        if not self.weighted:
            return self.budget_tokens - decoded
        return weighted_prefill_budget(
            self.budget_tokens, decoded, self.verify_tokens, self.weights
        )

    def chunk(self, left: int, budget: int) -> int:
        """Tokens of a prompt with ``left`` tokens to compute that an iteration computes
        within ``budget`` (at most ``chunk_tokens``)."""
        chunk = self.chunk_tokens
        if chunk < left:
            left = chunk
        return budget if budget < left else left
