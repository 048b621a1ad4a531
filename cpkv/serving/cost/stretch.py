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

Both are :class:`Durations`: ``duration(j)``, ``total(k)`` (the first ``k`` durations
summed) and ``steps_within(budget, limit)`` (the least ``k >= 1`` with ``total(k) >=
budget``, else ``limit``). The models' ``stretch`` also takes ``decode_context_step``
(keyword, default ``D``): the decode context's growth per step when it is not ``D``, as for
a CUDA-graph padded batch (:mod:`cpkv.serving.cost.graph_padding`), whose padding requests
read no context.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import Any, Final

_NEVER: Final = 1 << 62
"""The second piece's first iteration when there is one piece (none reaches it)."""


class Durations:
    """A stretch's iteration durations (module docstring)."""

    __slots__ = ()

    def duration(self, j: int) -> float:
        """Iteration ``j``'s duration."""
        raise NotImplementedError

    def total(self, steps: int) -> float:
        """The first ``steps`` iterations' durations, summed (0 for ``steps <= 0``)."""
        raise NotImplementedError

    def steps_within(self, budget: float, limit: int) -> int:
        """The iterations that start before ``budget`` (µs after the stretch's start), at
        most ``limit``: the least ``k >= 1`` with ``total(k) >= budget``, else ``limit``."""
        raise NotImplementedError


class AffinePieces(Durations):
    """Durations ``a + b j`` for ``j`` from each piece's first iteration on: ``pieces`` is
    ``[(first, a, b), ...]`` with the first piece's ``first`` 0 and increasing firsts;
    every duration must be positive (the clock moves on) and ``b`` is meant to be
    non-negative (the models' stretches: contexts only grow), which keeps :meth:`total`
    non-decreasing in ``k``, float for float.

    :meth:`total` of ``k`` in piece ``i`` is ``head_i + (a_i n + b_i (first_i + k - 1) n /
    2)`` with ``n = k - first_i`` and ``head_i`` the total up to ``first_i`` (no ``head``
    added in the first piece); one and two pieces (every model's stretch) take no loop."""

    __slots__ = ("pieces", "_a", "_b", "_split", "_a2", "_b2", "_head", "_firsts", "_heads")

    def __init__(self, pieces: Sequence[tuple[int, float, float]]) -> None:
        pieces = tuple(pieces)
        if not pieces or pieces[0][0] != 0:
            raise ValueError(f"the first piece must start at iteration 0: {pieces!r}")
        self.pieces = pieces
        _, self._a, self._b = pieces[0]
        self._firsts: list[int] = []  # three pieces or more: every first, every head
        self._heads: list[float] = []
        if len(pieces) == 1:
            self._split: int = _NEVER
            self._a2 = self._b2 = self._head = 0.0
            return
        self._split, self._a2, self._b2 = pieces[1]
        if not 0 < self._split:
            raise ValueError(f"the pieces' firsts must increase: {pieces!r}")
        self._head = self._piece_sum(0, self._split)
        if len(pieces) > 2:
            firsts: list[int] = [0, self._split]
            heads: list[float] = [0.0, self._head]
            for i in range(2, len(pieces)):
                first = pieces[i][0]
                if not firsts[-1] < first:
                    raise ValueError(f"the pieces' firsts must increase: {pieces!r}")
                heads.append(heads[-1] + self._piece_sum(i - 1, first))
                firsts.append(first)
            self._firsts, self._heads = firsts, heads

    def _piece_sum(self, i: int, last: int) -> float:
        """Piece ``i``'s durations from its first iteration to ``last - 1``, summed."""
        first, a, b = self.pieces[i]
        n = last - first
        return a * n + b * (first + last - 1) * n / 2.0

    def duration(self, j: int) -> float:
        """Iteration ``j``'s duration."""
        if j < self._split:
            if j < 0:
                raise ValueError(j)
            return self._a + self._b * j
        if not self._firsts:
            return self._a2 + self._b2 * j
        _, a, b = self.pieces[bisect_right(self._firsts, j) - 1]
        return a + b * j

    def total(self, steps: int) -> float:
        """The first ``steps`` iterations' durations, summed (0 for ``steps <= 0``)."""
        if steps <= self._split:
            if steps <= 0:
                return 0.0
            return self._a * steps + self._b * (steps - 1) * steps / 2.0
        if not self._firsts:
            first = self._split
            n = steps - first
            return self._head + (self._a2 * n + self._b2 * (first + steps - 1) * n / 2.0)
        i = bisect_right(self._firsts, steps - 1) - 1  # the piece of iteration steps - 1
        return self._heads[i] + self._piece_sum(i, steps)

    def steps_within(self, budget: float, limit: int) -> int:
        """The iterations that start before ``budget`` (µs after the stretch's start; > 0),
        at most ``limit``: the least ``k >= 1`` with ``total(k) >= budget``, else ``limit``
        (``limit`` itself when it is below 1). A closed-form guess in the piece where the
        sum reaches ``budget``, settled by a few :meth:`total` calls (:func:`_settle`)."""
        total = self.total
        if limit < 1 or total(limit) < budget:
            return limit
        if budget <= 0.0:
            return 1
        split = self._split
        if split >= limit or budget <= self._head:  # in the first piece (total(split) = head)
            k = _affine_steps(self._a, self._b, 0, budget)
            return _settle(total, k, 1, limit if limit < split else split, budget)
        if not self._firsts:
            k = split + _affine_steps(self._a2, self._b2, split, budget - self._head)
            return _settle(total, k, split + 1, limit, budget)
        firsts, heads = self._firsts, self._heads
        i = bisect_left(heads, budget)  # heads[i - 1] < budget <= heads[i] (heads increase)
        i = min(i, bisect_right(firsts, limit - 1)) - 1  # no piece at or after ``limit``
        first, a, b = self.pieces[i]
        top = firsts[i + 1] if i + 1 < len(firsts) and firsts[i + 1] < limit else limit
        k = first + _affine_steps(a, b, first, budget - heads[i])
        return _settle(total, k, first + 1, top, budget)


def line_total(a: float, b: float, steps: int) -> float:
    """The first ``steps`` durations ``a + b j`` (``j`` from 0), summed: one piece's
    :meth:`AffinePieces.total`, for callers that hold the piece's two numbers."""
    return a * steps + b * (steps - 1) * steps / 2.0


def line_steps_within(a: float, b: float, budget: float, limit: int) -> int:
    """:meth:`AffinePieces.steps_within` of one piece ``a + b j`` (``budget`` > 0, ``limit``
    >= 1): the least ``k >= 1`` whose durations sum to at least ``budget``, else ``limit``."""
    if a * limit + b * (limit - 1) * limit / 2.0 < budget:
        return limit
    k = _affine_steps(a, b, 0, budget)
    if k > limit:
        k = limit
    # the guess is nearly always right: then two sums tell, else the search settles it
    if a * k + b * (k - 1) * k / 2.0 >= budget and (
        k == 1 or a * (k - 1) + b * (k - 2) * (k - 1) / 2.0 < budget
    ):
        return k
    return _settle(lambda n: a * n + b * (n - 1) * n / 2.0, k, 1, limit, budget)


def _affine_steps(a: float, b: float, first: int, budget: float) -> int:
    """About how many iterations ``first, first + 1, ...`` of durations ``a + b j`` it takes
    to sum to ``budget`` (> 0): the positive root of ``c n + b n (n - 1) / 2 = budget``
    (``c`` the first one's duration) rounded up, in the form that does not cancel (the
    exact count is settled by the caller)."""
    c = a + b * first  # the first one's duration
    half = b / 2.0
    q = c - half  # half n^2 + q n - budget = 0
    if half == 0.0:
        n = budget / c if c > 0.0 else 1.0
    else:
        disc = q * q + 4.0 * half * budget
        root = math.sqrt(disc) if disc > 0.0 else 0.0
        if q > 0.0:
            n = 2.0 * budget / (q + root)
        else:
            n = (root - q) / (2.0 * half) if half > 0.0 else 1.0
    if not n < 1e18:  # (also NaN)
        return 1 << 60
    return math.ceil(n) if n > 1.0 else 1


def _settle(total: Any, k: int, lo: int, hi: int, budget: float) -> int:
    """The least ``k`` in ``[lo, hi]`` with ``total(k) >= budget``, from a guess: the
    caller knows ``total(hi) >= budget`` and ``total(lo - 1) < budget``. Two calls when the
    guess is right, galloping then bisecting away from it otherwise."""
    if k < lo:
        k = lo
    elif k > hi:
        k = hi
    if total(k) >= budget:
        if k == lo or total(k - 1) < budget:
            return k
        top, step = k - 1, 1  # total(top) >= budget
        while True:
            m = top - step
            if m < lo:
                below = lo - 1
                break
            if total(m) < budget:
                below = m
                break
            top, step = m, step * 2
    else:
        below, step = k, 1  # total(below) < budget
        top = hi
        while True:
            m = below + step
            if m >= top:
                break
            if total(m) >= budget:
                top = m
                break
            below, step = m, step * 2
    while top - below > 1:  # total(below) < budget <= total(top)
        mid = (below + top) // 2
        if total(mid) >= budget:
            top = mid
        else:
            below = mid
    return top


class Looped(Durations):
    """A stretch of any model, iteration by iteration (its ``batch_us``): the durations and
    their running sums are kept as far as they were asked for. ``decode_context_step``:
    the decode context's growth per step (default: the decode requests)."""

    __slots__ = ("cost", "args", "durations", "known", "_step")

    def __init__(
        self, cost: Any, args: tuple[int, ...], decode_context_step: int | None = None
    ) -> None:
        self.cost, self.args = cost, args
        self._step = args[1] if decode_context_step is None else decode_context_step
        self.durations: list[float] = []  # iteration j's
        self.known: list[float] = [0.0]  # sums of the first k durations, added in order

    def _extend(self, steps: int) -> None:
        prefill, decode, dc, pc, pairs, pc_step, pairs_step = self.args
        batch_us, known, durations, step = (
            self.cost.batch_us,
            self.known,
            self.durations,
            self._step,
        )
        for j in range(len(durations), steps):
            d = batch_us(
                prefill, decode, dc + step * j, pc + pc_step * j, pairs + pairs_step * j, 0
            )
            durations.append(d)
            known.append(known[-1] + d)

    def duration(self, j: int) -> float:
        if j < 0:
            raise ValueError(j)
        self._extend(j + 1)
        return self.durations[j]

    def total(self, steps: int) -> float:
        if steps <= 0:
            return 0.0
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
) -> Durations:
    """The durations of a stretch (module docstring) under ``cost``."""
    return durations_of(cost)(
        prefill_tokens, decode_requests, decode_context, prefill_context, attention_pairs,
        prefill_context_step, attention_pairs_step,
    )  # fmt: skip


def durations_of(cost: Any) -> Callable[..., Durations]:
    """What gives a stretch's durations under ``cost`` from its seven arguments
    (:func:`stretch_durations`'): the model's own ``stretch``, else a :class:`Looped`."""
    if getattr(type(cost), "stretch", None) is not None:
        return cost.stretch  # type: ignore[no-any-return]
    return lambda *args: Looped(cost, args)
