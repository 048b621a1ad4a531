"""Whom KV growth preempts when a new block does not fit: the ``admit.kv.victim`` orders.

Victim orders (``VICTIMS``), all choosing among the active requests, grower included:
``scan_order`` (the default: the grower itself), ``newest_first`` (last admitted),
``largest_first`` (most blocks, newest on ties), ``least_progress`` (fewest generated tokens,
then longest prompt, then newest: the order of SGLang's ``retract_decode``).

The optimistic policy (:mod:`cpkv.policies.growth`) and the serving engine's KV pool
(:mod:`cpkv.serving.model.kv_pool`) choose with these; :class:`cpkv.policies.blocks.KvBlocks`
validates the name against the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from cpkv.core.registry import Registry


class Prompted(Protocol):
    """What a victim order reads of a request: its prompt length."""

    prompt_tokens: int


@dataclass(eq=False)
class Holder:
    """An admitted request's live state during growth (internal, mutable)."""

    order: int
    request: Prompted
    length_tokens: int
    blocks: int

    @property
    def generated_tokens(self) -> int:
        return self.length_tokens - self.request.prompt_tokens


Victim = Callable[[Iterable[Holder], Holder], Holder]
"""A victim order: ``(active, grower)`` to the victim's holder. Each order reads ``active``
at most once, and ``scan_order`` not at all: a caller may pass it lazily."""
VICTIMS: Registry[Victim] = Registry("victim order")


@VICTIMS.register("scan_order", help="the request whose growth does not fit (the default)")
def scan_order(active: Iterable[Holder], grower: Holder) -> Holder:
    """The request that just grew past the capacity."""
    return grower


@VICTIMS.register("newest_first", help="the most recently admitted active request")
def newest_first(active: Iterable[Holder], grower: Holder) -> Holder:
    """The active request admitted last."""
    return max(active, key=lambda h: h.order)


@VICTIMS.register(
    "largest_first", help="the active request holding the most blocks (newest on ties)"
)
def largest_first(active: Iterable[Holder], grower: Holder) -> Holder:
    """The active request holding the most blocks; the newest among equals."""
    return max(active, key=lambda h: (h.blocks, h.order))


@VICTIMS.register(
    "least_progress",
    help="fewest generated tokens, then longest prompt, then newest (SGLang retract order)",
)
def least_progress(active: Iterable[Holder], grower: Holder) -> Holder:
    """Fewest generated tokens, then the longest prompt, then the newest."""
    return min(active, key=lambda h: (h.generated_tokens, -h.request.prompt_tokens, -h.order))
