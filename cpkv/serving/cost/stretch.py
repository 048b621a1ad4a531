"""The durations of a stretch of iterations whose cost arguments grow by a constant step.

Between events the serving engine runs iterations in which the batch's shape is fixed: the
same ``prefill_tokens`` and ``decode_requests`` every iteration, the decode context growing
by ``decode_requests`` tokens a step (each running request reads one more token), the
prefill context and the attention pairs by constant steps (each prefill row computes a
fixed chunk after a prefix that grows by it), nothing loaded. Iteration ``j`` (from 0) of
the stretch is ``batch_us(P, D, dc + D j, pc + pc_step j, pairs + pairs_step j, 0)``.

A model that can write that as a piecewise affine function of ``j`` offers
``stretch(P, D, dc, pc, pairs, pc_step, pairs_step)`` returning :class:`AffinePieces`; the
sums over any number of iterations and the number of iterations that fit before a time are
then closed forms, whatever the stretch's length. Any other model's stretch is evaluated
iteration by iteration (:class:`Looped`). :func:`stretch_durations` picks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


class AffinePieces:
    """Durations ``a + b j`` for ``j`` from each piece's first iteration on: ``pieces`` is
    ``[(first, a, b), ...]`` with the first piece's ``first`` 0 and increasing firsts;
    every duration must be positive (the clock moves on)."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: Sequence[tuple[int, float, float]]) -> None:
        self.pieces = tuple(pieces)

    def duration(self, j: int) -> float:
        """Iteration ``j``'s duration."""
        for first, a, b in reversed(self.pieces):
            if j >= first:
                return a + b * j
        raise ValueError(j)

    def total(self, steps: int) -> float:
        """The first ``steps`` iterations' durations, summed."""
        out = 0.0
        pieces = self.pieces
        for i, (first, a, b) in enumerate(pieces):
            if first >= steps:
                break
            last = pieces[i + 1][0] if i + 1 < len(pieces) else steps
            last = min(last, steps)
            n = last - first  # iterations first .. last - 1
            out += a * n + b * (first + last - 1) * n / 2.0
        return out

    def steps_within(self, budget: float, limit: int) -> int:
        """The iterations that start before ``budget`` (µs after the stretch's start; > 0),
        at most ``limit``: the least ``k >= 1`` with ``total(k) >= budget``, else ``limit``."""
        if self.total(limit) < budget:
            return limit
        done = 0.0
        pieces = self.pieces
        for i, (first, a, b) in enumerate(pieces):
            last = pieces[i + 1][0] if i + 1 < len(pieces) else limit
            last = min(last, limit)
            span = self.total(last) - self.total(first) if last > first else 0.0
            if done + span >= budget or i + 1 == len(pieces) or last >= limit:
                k = first + _affine_steps(a, b, first, budget - done)
                return _settle(self, max(1, min(k, limit)), budget, limit)
            done += span
        return limit


def _affine_steps(a: float, b: float, first: int, budget: float) -> int:
    """About how many iterations ``first, first + 1, ...`` of durations ``a + b j`` it takes
    to sum to ``budget`` (the exact count is settled by the caller)."""
    c = a + b * first  # the first one's duration
    if b == 0.0:
        return math.ceil(budget / c) if c > 0 else 1
    # n c + b n (n - 1) / 2 = budget
    half = b / 2.0
    disc = (c - half) ** 2 + 4.0 * half * budget
    root = (-(c - half) + math.sqrt(max(disc, 0.0))) / (2.0 * half)
    return max(1, math.ceil(root)) if math.isfinite(root) else 1


def _settle(durations: AffinePieces, k: int, budget: float, limit: int) -> int:
    """The least ``k`` with ``total(k) >= budget``, from a guess."""
    total = durations.total
    while k > 1 and total(k - 1) >= budget:
        k -= 1
    while k < limit and total(k) < budget:
        k += 1
    return k


class Looped:
    """A stretch of any model, iteration by iteration (its ``batch_us``)."""

    __slots__ = ("cost", "args", "known")

    def __init__(self, cost: Any, args: tuple[int, ...]) -> None:
        self.cost, self.args = cost, args
        self.known: list[float] = [0.0]  # sums of the first k durations

    def _extend(self, steps: int) -> None:
        prefill, decode, dc, pc, pairs, pc_step, pairs_step = self.args
        batch_us, known = self.cost.batch_us, self.known
        for j in range(len(known) - 1, steps):
            known.append(
                known[-1]
                + batch_us(prefill, decode, dc + decode * j, pc + pc_step * j,
                           pairs + pairs_step * j, 0)  # fmt: skip
            )

    def duration(self, j: int) -> float:
        self._extend(j + 1)
        return self.known[j + 1] - self.known[j]

    def total(self, steps: int) -> float:
        self._extend(steps)
        return self.known[steps]

    def steps_within(self, budget: float, limit: int) -> int:
        known = self.known
        k = 1
        while k < limit:
            self._extend(k)
            if known[k] >= budget:
                return k
            k += 1
        return limit


def stretch_durations(
    cost: Any,
    prefill_tokens: int,
    decode_requests: int,
    decode_context: int,
    prefill_context: int,
    attention_pairs: int,
    prefill_context_step: int,
    attention_pairs_step: int,
) -> AffinePieces | Looped:
    """The durations of a stretch (module docstring) under ``cost``."""
    args = (
        prefill_tokens, decode_requests, decode_context, prefill_context, attention_pairs,
        prefill_context_step, attention_pairs_step,
    )  # fmt: skip
    if getattr(type(cost), "stretch", None) is not None:
        return cost.stretch(*args)
    return Looped(cost, args)
