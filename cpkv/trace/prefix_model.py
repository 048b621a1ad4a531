"""Synthetic prefix sharing for traces that carry no prefix information (``azure_csv``).

The Azure LLM inference traces give each request's token counts and arrival, nothing about
its content: read as they are, no two requests share a block (``model: none``), so a prefix
cache never hits. ``model: shared`` lays a synthetic prefix over them — the shape of shared
system prompts or few-shot templates:

* there are ``groups`` distinct shared prefixes, each ``tokens`` tokens long;
* a request starts with one of them with probability ``fraction``; which one is drawn with
  weights ``1 / (g + 1) ** zipf`` for group ``g = 0 .. groups - 1`` (``zipf: 0``: uniform;
  larger: a few hot prefixes);
* the request's first ``min(tokens, input_length) // block_size`` blocks become the group's
  blocks (equal hashes across the group's requests); its other blocks stay its own. Only
  whole blocks are shared, so a request shorter than a block shares nothing.

The draws are a pure function of ``(seed, request index)`` (two uniform numbers per request
from SplitMix64, a counter-based generator), so a request's prefix does not depend on which
slice of the trace is read (``start``, ``limit``), and the same seed gives the same workload.

Config: ``trace.prefix`` (``cpkv trace stats|curve``) and ``admit.workload.prefix``.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from cpkv.core.schema import non_negative, positive, require
from cpkv.core.schema.limits import MAX_TOKENS, TOKENS_WHY

SHARED_HASH_BASE = -(1 << 50)
"""Hash ids of shared prefix blocks: group ``g``'s block ``j`` is ``SHARED_HASH_BASE - g * 2**20
- j`` (negative and below every per-request Azure hash, so they never collide)."""
NO_PREFIX_FORMATS = ("azure_csv",)
"""Trace formats without prefix information: the only ones a synthetic prefix applies to."""

_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class PrefixSpec:
    """``prefix``: a synthetic prefix-sharing model for a trace without prefix information
    (see the module docstring)."""

    model: Literal["none", "shared"] = "none"
    groups: int = 8
    tokens: int = 1024
    fraction: float = 1.0
    zipf: float = 0.0
    seed: int = 0

    def validate(self) -> None:
        positive("groups", self.groups)
        positive("tokens", self.tokens)
        require(
            self.tokens <= MAX_TOKENS,
            "tokens",
            f"must be <= {MAX_TOKENS} ({TOKENS_WHY}), got {self.tokens}",
        )
        require(0 <= self.fraction <= 1, "fraction", f"must be in [0, 1], got {self.fraction}")
        non_negative("zipf", self.zipf)
        require(
            self.groups < 1 << 20,
            "groups",
            f"must be below 2**20 (hash ids per group), got {self.groups}",
        )


def check_prefix_format(spec: PrefixSpec, format: str) -> None:
    """FieldError (key ``prefix.model``) for a synthetic prefix on a trace format that carries
    its own prefix hashes."""
    require(
        spec.model == "none" or format in NO_PREFIX_FORMATS,
        "prefix.model",
        f"{spec.model}: the {format} format carries its own prefix hashes; a synthetic prefix "
        f"applies to traces without them ({', '.join(NO_PREFIX_FORMATS)}); allowed here: none",
    )


def splitmix64(x: int) -> int:
    """One step of SplitMix64 (Steele, Lea and Flood, 2014): a 64-bit integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform(seed: int, index: int, stream: int) -> float:
    """A uniform number in [0, 1) for ``(seed, index, stream)`` (53 bits of SplitMix64)."""
    key = splitmix64((seed & _MASK) ^ splitmix64((index << 1) | stream))
    return (key >> 11) / float(1 << 53)


def shared_group(spec: PrefixSpec, index: int) -> int | None:
    """The shared prefix group of request ``index``, or None when it starts with none."""
    if spec.model == "none" or uniform(spec.seed, index, 0) >= spec.fraction:
        return None
    weights = [1.0 / (g + 1) ** spec.zipf for g in range(spec.groups)]
    bounds = list(itertools.accumulate(weights))
    return min(
        bisect.bisect_right(bounds, uniform(spec.seed, index, 1) * bounds[-1]), spec.groups - 1
    )


def with_prefix(
    hash_ids: tuple[int, ...], input_length: int, index: int, spec: PrefixSpec, block_size: int
) -> tuple[int, ...]:
    """``hash_ids`` with the leading blocks of request ``index``'s shared prefix (if any)."""
    group = shared_group(spec, index)
    if group is None:
        return hash_ids
    shared = min(spec.tokens, input_length) // block_size
    first = SHARED_HASH_BASE - group * (1 << 20)
    return tuple(range(first, first - shared, -1)) + hash_ids[shared:]


def apply_prefix(requests: Iterable, spec: PrefixSpec, block_size: int) -> Iterator:
    """Trace requests (:class:`~cpkv.trace.readers.TraceRequest`) with ``spec``'s prefixes."""
    from dataclasses import replace

    for r in requests:
        hashes = with_prefix(r.hash_ids, r.input_length, r.index, spec, block_size)
        yield r if hashes is r.hash_ids else replace(r, hash_ids=hashes)
