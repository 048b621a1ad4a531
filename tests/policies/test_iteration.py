"""Seed 004's iteration budget against a token-by-token restatement of the seed's rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.core.errors import ConfigError
from cpkv.policies.iteration import IterationBudget, iteration_trace


class Livelock(Exception):
    """The seed's loop would never end: a tick with prompt left moves no prompt token."""


def reference_trace(
    prompt: int, decodes: int, budget: int, chunk: int
) -> list[tuple[int, int, int, int]]:
    """Hand out the tick's budget one token at a time: every decode first, then prompt
    tokens while the prompt, the chunk cap and the budget allow (the seed's description)."""
    ticks: list[tuple[int, int, int, int]] = []
    left = prompt
    while left > 0:
        work = budget
        decoded = 0
        for _ in range(decodes):
            if work == 0:
                break
            work -= 1
            decoded += 1
        chunked = 0
        while left > 0 and work > 0 and chunked < chunk:
            left -= 1
            work -= 1
            chunked += 1
        if chunked == 0:
            raise Livelock
        ticks.append((len(ticks), decoded, chunked, left))
    return ticks


def as_tuples(budget: IterationBudget) -> list[tuple[int, int, int, int]]:
    return [
        (t.tick, t.decode_tokens, t.prefill_tokens, t.remaining_prompt_tokens)
        for t in iteration_trace(budget)
    ]


def test_seed_example_three_ticks_of_two_plus_four() -> None:
    # the seed's worked example: budget 6, 2 decodes, prompt 12, chunk 4
    assert as_tuples(IterationBudget(6, 2, 12, 4)) == [(0, 2, 4, 8), (1, 2, 4, 4), (2, 2, 4, 0)]
    assert IterationBudget() == IterationBudget(
        budget_tokens=6, decode_requests=2, prompt_tokens=12, chunk_tokens=4
    )


def test_hand_example_budget_caps_below_chunk_and_last_tick_is_short() -> None:
    # budget 5 - 2 decodes = 3 < chunk 4; 10 = 3 + 3 + 3 + 1
    assert as_tuples(IterationBudget(5, 2, 10, 4)) == [
        (0, 2, 3, 7),
        (1, 2, 3, 4),
        (2, 2, 3, 1),
        (3, 2, 1, 0),
    ]


def test_no_prompt_is_an_empty_trace_even_with_no_budget() -> None:
    assert iteration_trace(IterationBudget(0, 3, 0, 0)) == ()


@pytest.mark.parametrize(
    ("budget", "key"),
    [
        (IterationBudget(6, 2, 12, 0), "admit.iteration.chunk_tokens"),
        (IterationBudget(2, 2, 12, 4), "admit.iteration.budget_tokens"),
        (IterationBudget(1, 3, 1, 4), "admit.iteration.budget_tokens"),
        (IterationBudget(6, -1, 12, 4), "admit.iteration.decode_requests"),
        (IterationBudget(6, 2, -12, 4), "admit.iteration.prompt_tokens"),
    ],
)
def test_degenerate_inputs_raise_naming_the_key_instead_of_livelocking(
    budget: IterationBudget, key: str
) -> None:
    with pytest.raises(ConfigError, match=key):
        iteration_trace(budget)


@settings(max_examples=400, deadline=None)
@given(
    budget=st.integers(0, 40),
    decodes=st.integers(0, 40),
    prompt=st.integers(0, 300),
    chunk=st.integers(0, 50),
)
def test_matches_token_by_token_reference(
    budget: int, decodes: int, prompt: int, chunk: int
) -> None:
    config = IterationBudget(budget, decodes, prompt, chunk)
    try:
        want = reference_trace(prompt, decodes, budget, chunk)
    except Livelock:
        with pytest.raises(ConfigError, match=r"admit\.iteration\.(chunk|budget)_tokens"):
            iteration_trace(config)
        return
    got = as_tuples(config)
    assert got == want
    assert all(d + p <= budget for _, d, p, _ in got)
