"""Values drawn from one ``random.Random`` exactly as its own methods draw them: the same
values, the generator left in the same state.

* :class:`TokenSampler`: one token count of a synthetic distribution (``0`` with probability
  ``zero_fraction``, one ``rng.random()`` drawn first when it is positive; else one of
  ``choices`` as ``rng.choice`` draws it, or ``rng.randint(low, high)``);
* :class:`RequestSampler`: a request's ``(l1, l2, extend, max_new or None)``, drawn in that
  order;
* :class:`ExponentialSampler`: ``rng.expovariate(rate)``.

``rng.choice`` draws its index as ``r = rng.getrandbits(n.bit_length())`` until ``r < n``, and
``rng.expovariate(rate)`` is ``-log(1 - rng.random()) / rate``; the samplers take those steps
themselves (fewer calls per value) only after checking, on the generator's own state, that
they give what its methods give: a subclass of ``random.Random`` or another Python keeps its
own methods.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from math import log
from typing import Final

CHECKED_DRAWS: Final = 64
"""Values compared with the generator's own method before a sampler takes its steps itself."""


class TokenSampler:
    """One value of a token-count distribution per :meth:`draw` (module docstring)."""

    def __init__(
        self, rng: random.Random, choices: Sequence[int] | None, low: int, high: int,
        zero_fraction: float,
    ) -> None:  # fmt: skip
        self.rng = rng
        self.zero_fraction = zero_fraction
        self.picks = choices is not None
        self.choices: list[int] = [] if choices is None else list(choices)
        self.low, self.high = low, high
        self.bits = len(self.choices).bit_length()
        self.by_bits = self.picks and _same_draws(rng, self._choice_by_bits, self._choice)

    def draw(self) -> int:
        rng = self.rng
        if self.zero_fraction > 0 and rng.random() < self.zero_fraction:
            return 0
        if not self.picks:
            return rng.randint(self.low, self.high)
        if self.by_bits:
            return self._choice_by_bits()
        return self._choice()

    def _choice(self) -> int:
        return self.rng.choice(self.choices)

    def _choice_by_bits(self) -> int:
        rng, bits, n = self.rng, self.bits, len(self.choices)
        r = rng.getrandbits(bits)
        while r >= n:
            r = rng.getrandbits(bits)
        return self.choices[r]


class RequestSampler:
    """A request's ``(l1, l2, extend, max_new or None)`` per :meth:`draw`, in that order
    (``max_new`` None: not drawn)."""

    def __init__(
        self, l1: TokenSampler, l2: TokenSampler, extend: TokenSampler,
        max_new: TokenSampler | None,
    ) -> None:  # fmt: skip
        self.l1, self.l2, self.extend, self.max_new = l1, l2, extend, max_new

    def draw(self) -> tuple[int, int, int, int | None]:
        l1 = self.l1.draw()
        l2 = self.l2.draw()
        extend = self.extend.draw()
        max_new = self.max_new
        return l1, l2, extend, None if max_new is None else max_new.draw()


class ExponentialSampler:
    """``rng.expovariate(rate)`` per :meth:`draw` (module docstring)."""

    def __init__(self, rng: random.Random, rate: float) -> None:
        self.rng, self.rate = rng, rate
        self.by_log = _same_draws(rng, self._by_log, self._expovariate)

    def draw(self) -> float:
        if self.by_log:
            return self._by_log()
        return self._expovariate()

    def _expovariate(self) -> float:
        return self.rng.expovariate(self.rate)

    def _by_log(self) -> float:
        return -log(1.0 - self.rng.random()) / self.rate


def _same_draws(
    rng: random.Random, own: Callable[[], object], methods: Callable[[], object]
) -> bool:
    """Whether ``own()`` gives the values ``methods()`` gives, :data:`CHECKED_DRAWS` of them,
    and leaves ``rng`` in the same state (``rng`` is left as it was)."""
    state = rng.getstate()
    try:
        want = [methods() for _ in range(CHECKED_DRAWS)]
        after = rng.getstate()
        rng.setstate(state)
        got = [own() for _ in range(CHECKED_DRAWS)]
        return got == want and rng.getstate() == after
    except (IndexError, ValueError):
        return False
    finally:
        rng.setstate(state)
