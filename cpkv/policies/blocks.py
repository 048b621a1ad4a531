"""The KV block model of the block policies, its admission scans, and the conservative policy.

A request ``r`` holds ``ceil(prompt_tokens / block_size)`` blocks once prefilled and may
grow to ``ceil((prompt_tokens + max_new_tokens) / block_size)``. The *conservative*
policy reserves that maximum at admission; the *optimistic* one (:mod:`cpkv.policies.growth`)
admits on the current prompt blocks and preempts when growth does not fit.

A *scan* decides which requests, in input order, get their blocks (``SCANS``):

* ``first_fit`` (the conservative policy's default scan): admit every request that still fits,
  skipping over those that do not (a later, smaller request may pass a larger one);
* ``fcfs_stop``: stop at the first request that does not fit, like SGLang's scan loop;
* ``all_or_error`` (the optimistic policy's default admission): admit everyone; an error if
  the blocks needed exceed the capacity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from cpkv.core.errors import ConfigError, InputError
from cpkv.core.registry import Registry
from cpkv.core.schema import FieldError, Range, require
from cpkv.core.schema.keys import check_bounds
from cpkv.core.schema.limits import MAX_TOKENS, TOKENS_WHY, Tokens
from cpkv.core.suggest import did_you_mean
from cpkv.policies.victims import VICTIMS
from cpkv.runs.results import metric, outcome

Scan = Callable[[Sequence[int], int], tuple[str, ...]]
SCANS: Registry[Scan] = Registry("admission scan")

ADMITTED, NO_ROOM, AFTER_STOP = "admitted", "no_room", "after_stop"
DEFAULT_SCANS = {"conservative": "first_fit", "optimistic": "all_or_error"}
"""The scan each policy uses when ``admit.kv.scan`` is null."""


@dataclass(frozen=True)
class KvBlocks:
    """The ``admit.kv`` block: the block model and the block policies' options.

    ``scan`` null means the policy's default scan (conservative ``first_fit``,
    optimistic ``all_or_error``). ``victim`` picks whom optimistic growth preempts
    (:data:`cpkv.policies.victims.VICTIMS`). ``on_finish``: ``keep`` (the default: a
    finished request keeps its blocks) or ``free`` (its blocks return, with a ``finished`` event).
    """

    block_size: Annotated[int, Range(0, MAX_TOKENS, low_open=True, why=TOKENS_WHY)] = 4
    capacity_blocks: Tokens = 4
    scan: str | None = None
    victim: str = "scan_order"
    on_finish: Literal["keep", "free"] = "keep"
    safety_margin_blocks: Tokens = 0  # mode serving: blocks no request may take (workspace)

    def validate(self) -> None:
        """Raise :class:`~cpkv.core.schema.FieldError` (key relative to the block) if unusable."""
        check_bounds(self)
        tokens = self.capacity_blocks * self.block_size
        require(
            tokens <= MAX_TOKENS,
            "capacity_blocks",
            f"{self.capacity_blocks} blocks x block_size {self.block_size} = {tokens} tokens; "
            f"must be <= {MAX_TOKENS} ({TOKENS_WHY})",
        )
        if self.scan is not None:
            require(
                self.scan in SCANS,
                "scan",
                f"unknown scan {self.scan!r}{did_you_mean(self.scan, SCANS.allowed())} "
                f"(allowed: {', '.join(SCANS.allowed())}, or null)",
            )
        require(
            self.victim in VICTIMS,
            "victim",
            f"unknown victim order {self.victim!r}{did_you_mean(self.victim, VICTIMS.allowed())} "
            f"(allowed: {', '.join(VICTIMS.allowed())})",
        )
        require(
            self.on_finish in ("keep", "free"),
            "on_finish",
            f"unknown value {self.on_finish!r}{did_you_mean(self.on_finish, ('keep', 'free'))} "
            "(allowed: keep, free)",
        )


DEFAULT_KV = KvBlocks()


@dataclass(frozen=True)
class BlockRequest:
    """A request of the block policies (JSONL: ``rid``, ``prompt_tokens``, ``max_new_tokens``)."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int

    def prompt_blocks(self, block_size: int) -> int:
        """Blocks the prefilled prompt occupies."""
        return math.ceil(self.prompt_tokens / block_size)

    def reserve_blocks(self, block_size: int) -> int:
        """Blocks the request needs if it generates all ``max_new_tokens``."""
        return math.ceil((self.prompt_tokens + self.max_new_tokens) / block_size)


@dataclass(frozen=True)
class AdmitDecision:
    """One request's admission: blocks it needed, whether it got them, and why."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    need_blocks: int = metric(unit="blocks")
    admitted: bool = outcome()
    reason: str = outcome()  # admitted | no_room | after_stop
    reserved_blocks_after: int = metric(unit="blocks")


@dataclass(frozen=True)
class GrowthEvent:
    """One event of optimistic growth; ``used_blocks`` is counted right after it."""

    step: int
    rid: str
    event: str  # advanced | preempted | finished
    used_blocks: int


@dataclass(frozen=True)
class BlockOutcome:
    """What a block policy did: admissions in input order, then (optimistic) growth events."""

    policy: str
    admitted: tuple[str, ...]
    reserved_blocks: int
    decisions: tuple[AdmitDecision, ...]
    events: tuple[GrowthEvent, ...] = ()
    final_used_blocks: int = 0
    peak_used_blocks: int = 0


def checked_kv(kv: KvBlocks, key: str = "admit.kv") -> KvBlocks:
    """``kv`` after validation; ConfigError naming ``key`` + field otherwise."""
    try:
        kv.validate()
    except FieldError as err:
        raise ConfigError(f"{key}.{err.key}: {err.detail}") from None
    return kv


def check_requests(requests: Sequence[BlockRequest]) -> None:
    """InputError for negative token counts or a repeated ``rid``."""
    seen: set[str] = set()
    for r in requests:
        if r.prompt_tokens < 0 or r.max_new_tokens < 0:
            raise InputError(
                f"request {r.rid!r}: prompt_tokens and max_new_tokens must be >= 0, got {r.prompt_tokens} and {r.max_new_tokens}"
            )
        if r.rid in seen:
            raise InputError(f"request rid {r.rid!r} appears twice; rids must be unique")
        seen.add(r.rid)


def admit_by_scan(
    policy: str, requests: Sequence[BlockRequest], needs: Sequence[int], kv: KvBlocks, scan: str
) -> BlockOutcome:
    """Run ``scan`` over ``needs`` and record one decision per request."""
    reasons = SCANS.get(scan)(needs, kv.capacity_blocks)
    decisions, total = [], 0
    for r, need, reason in zip(requests, needs, reasons, strict=True):
        total += need if reason == ADMITTED else 0
        decisions.append(
            AdmitDecision(
                r.rid, r.prompt_tokens, r.max_new_tokens, need, reason == ADMITTED, reason, total
            )
        )
    admitted = tuple(d.rid for d in decisions if d.admitted)
    return BlockOutcome(policy, admitted, total, tuple(decisions), (), total, total)


def conservative(requests: Sequence[BlockRequest], kv: KvBlocks = DEFAULT_KV) -> BlockOutcome:
    """Reserve ``ceil((prompt + max_new) / block_size)`` blocks per admitted request."""
    checked_kv(kv)
    check_requests(requests)
    needs = [r.reserve_blocks(kv.block_size) for r in requests]
    return admit_by_scan(
        "conservative", requests, needs, kv, kv.scan or DEFAULT_SCANS["conservative"]
    )


@SCANS.register(
    "first_fit",
    help="admit each request that fits, keep scanning past those that do not",
)
def first_fit(needs: Sequence[int], capacity: int) -> tuple[str, ...]:
    """Admit every request that fits in what is left, in order; skip the others."""
    left, out = capacity, []
    for need in needs:
        fits = need <= left
        left -= need if fits else 0
        out.append(ADMITTED if fits else NO_ROOM)
    return tuple(out)


@SCANS.register(
    "fcfs_stop", help="admit in order, stop at the first request that does not fit (like SGLang)"
)
def fcfs_stop(needs: Sequence[int], capacity: int) -> tuple[str, ...]:
    """Admit in order until one does not fit; it and every later request wait."""
    out = list(first_fit(needs, capacity))
    if NO_ROOM in out:
        stop = out.index(NO_ROOM)
        out[stop + 1 :] = [AFTER_STOP] * (len(out) - stop - 1)
    return tuple(out)


@SCANS.register(
    "all_or_error",
    help="admit every request; error if they do not all fit (optimistic default)",
)
def all_or_error(needs: Sequence[int], capacity: int) -> tuple[str, ...]:
    """Admit all; ConfigError if their blocks exceed ``capacity``."""
    total = sum(needs)
    if total > capacity:
        raise ConfigError(
            f"admit.kv.capacity_blocks: the requests need {total} blocks at admission but capacity is "
            f"{capacity} (scan all_or_error, the optimistic default); raise the capacity or set admit.kv.scan to "
            f"first_fit or fcfs_stop"
        )
    return (ADMITTED,) * len(needs)
