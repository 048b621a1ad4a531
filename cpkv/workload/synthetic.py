"""The ``synthetic`` workload source: ``count`` seeded random requests, no file needed.

``admit.workload.synthetic`` holds ``count``, ``seed`` and one :class:`TokenDist` per token
count. A distribution draws, for each request:

* ``0`` with probability ``zero_fraction`` (one ``rng.random()`` draw, made only when
  ``zero_fraction > 0``); otherwise
* one of ``choices`` (uniformly, ``rng.choice``) when ``choices`` is given, else a uniform
  integer in ``[low, high]`` (``rng.randint``).

Requests are drawn in queue order from one ``random.Random(seed)``; for each request the
fields are drawn in the order ``l1_cached_tokens``, ``l2_cached_tokens``, ``extend_tokens``,
``max_new_tokens`` (that last one only when its distribution is given; ``null`` takes the
budget's ``max_new_tokens``). Request ``k`` is named ``s{k}``. ``seed: null`` (the default)
takes the experiment's top-level ``seed``. The same spec and seed give the same requests on
every machine and Python version (``random.Random`` with integer seeds is stable).

``lengths`` (:mod:`cpkv.workload.lengths`) replaces the ``extend_tokens`` and
``max_new_tokens`` distributions by (prompt, output) pairs drawn from a user's file.

The defaults draw requests shaped like the seed benchmark's JSONL example: an L1 hit on 60%
of the requests (1..40320 tokens), an L2 hit on half (1..32768), 1..4096 new tokens.

``cpkv admit --write-workload PATH`` (:mod:`cpkv.workload.jsonl_writer`) writes any workload,
this one included, as a file for the ``jsonl`` source.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cpkv.core.schema import FieldError, require
from cpkv.core.schema.limits import Tokens
from cpkv.workload.lengths import LengthsFile, read_lengths, split_prompt
from cpkv.workload.request import Request, new_request
from cpkv.workload.sampling import RequestSampler, TokenSampler


@dataclass(frozen=True)
class TokenDist:
    """A token count: 0 with probability ``zero_fraction``, else ``choices`` or ``[low, high]``."""

    low: Tokens = 0
    high: Tokens = 0
    choices: tuple[Tokens, ...] | None = None
    zero_fraction: float = 0.0

    def validate(self) -> None:
        require(
            0.0 <= self.zero_fraction <= 1.0,
            "zero_fraction",
            f"must be between 0 and 1, got {self.zero_fraction}",
        )
        if self.choices is not None:
            require(len(self.choices) > 0, "choices", "needs at least one value (or null)")
            for v in self.choices:
                require(v >= 0, "choices", f"every value must be >= 0, got {v}")
            return
        require(self.low >= 0, "low", f"must be >= 0, got {self.low}")
        require(self.high >= self.low, "high", f"must be >= low ({self.low}), got {self.high}")

    def largest(self) -> int:
        """The largest value this distribution can draw."""
        if self.zero_fraction >= 1:
            return 0
        return max(self.choices) if self.choices is not None else self.high

    def smallest(self) -> int:
        """The smallest value this distribution can draw."""
        if self.zero_fraction > 0:
            return 0
        return min(self.choices) if self.choices is not None else self.low


DEFAULT_EXTEND = TokenDist(low=1, high=4096)


@dataclass(frozen=True)
class SyntheticSpec:
    """``admit.workload.synthetic``: how many requests, the seed, one distribution per field."""

    count: int = 1000
    seed: int | None = None
    l1_cached_tokens: TokenDist = TokenDist(low=1, high=40320, zero_fraction=0.4)
    l2_cached_tokens: TokenDist = TokenDist(low=1, high=32768, zero_fraction=0.5)
    extend_tokens: TokenDist = DEFAULT_EXTEND
    max_new_tokens: TokenDist | None = None
    lengths: LengthsFile | None = None

    def validate(self) -> None:
        require(self.count >= 1, "count", f"must be >= 1, got {self.count}")
        if self.lengths is not None:
            require(
                self.max_new_tokens is None and self.extend_tokens == DEFAULT_EXTEND,
                "lengths",
                "gives each request's prompt and output length; leave extend_tokens and "
                "max_new_tokens unset beside it",
            )
        ext = self.extend_tokens
        if ext.smallest() < 1:
            key = (
                "extend_tokens.zero_fraction"
                if ext.zero_fraction > 0
                else "extend_tokens.choices"
                if ext.choices is not None
                else "extend_tokens.low"
            )
            raise FieldError(
                key, "extend_tokens must never draw 0 (SGLang always computes a token): "
                "use zero_fraction 0 and values >= 1"
            )  # fmt: skip


DEFAULT_SYNTHETIC = SyntheticSpec()


def _sampler(dist: TokenDist, rng: random.Random) -> TokenSampler:
    """The sampler of one value of ``dist`` from ``rng``."""
    return TokenSampler(rng, dist.choices, dist.low, dist.high, dist.zero_fraction)


def synthetic_requests(spec) -> tuple[Request, ...]:  # spec: WorkloadSpec
    """``admit.workload`` (source ``synthetic``): ``spec.synthetic.count`` seeded requests."""
    new = new_request
    return tuple(new(rid, a, b, e, m, 0, 0.0) for rid, a, b, e, m in synthetic_draws(spec))


def synthetic_draws(spec) -> Iterator[tuple[str, int, int, int, int | None]]:
    """The draws of :func:`synthetic_requests`, one request at a time, as ``(rid, l1, l2,
    extend, max_new or None)``."""
    draw = synthetic_sampler(spec)
    for k in range(spec.synthetic.count):
        yield (f"s{k}", *draw())


def synthetic_sampler(spec) -> Any:
    """A no-argument function drawing one request's ``(l1, l2, extend, max_new or None)``
    from the run's one ``random.Random(seed)``, in the order the module docstring gives
    (the serving engine draws a million requests that way, lazily). With ``lengths``, the
    hits are drawn, then a row of the file (``rng.randrange``), and the hits clipped into its
    prompt (:mod:`cpkv.workload.lengths`)."""
    syn: SyntheticSpec = spec.synthetic
    rng = random.Random(0 if syn.seed is None else syn.seed)
    l1 = _sampler(syn.l1_cached_tokens, rng)
    l2 = _sampler(syn.l2_cached_tokens, rng)
    if syn.lengths is not None:
        rows, pick = read_lengths(syn.lengths), rng.randrange

        def from_file() -> tuple[int, int, int, int]:
            a, b = l1.draw(), l2.draw()
            prompt, output = rows[pick(len(rows))]
            return (*split_prompt(prompt, a, b), output)

        return from_file
    ext = _sampler(syn.extend_tokens, rng)
    mx = None if syn.max_new_tokens is None else _sampler(syn.max_new_tokens, rng)
    return RequestSampler(l1, l2, ext, mx).draw
