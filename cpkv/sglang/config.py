"""The knobs of SGLang 0.5.23's scheduler loop that the model reads, under SGLang's names.

Defaults are SGLang 0.5.23's ``ServerArgs`` and environment defaults where it has them
(``max_prefill_tokens`` 16384, ``schedule_conservativeness`` 1.0, mixed chunk off, overlap
scheduling on, the radix cache on, page size 1; the new-token ratio: ``SGLANG_INIT_NEW_TOKEN_RATIO``
0.7, ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`` 0.14, ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` 600,
``SGLANG_RETRACT_DECODE_STEPS`` 20). What a GPU would resolve at start-up has no default and
must be given: ``max_total_num_tokens`` (the KV pool's tokens), ``max_running_requests`` (also
the request-to-token pool's rows), ``chunked_prefill_size`` (None: chunked prefill off) and
``context_len``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

SCHEDULE_POLICIES = (
    "fcfs", "lof", "random", "lpm", "hrrn", "shortest-prefill-first", "dfs-weight",
)  # fmt: skip
RETRACTION_POLICIES = ("length", "priority")
CLIP_MAX_NEW_TOKENS: Final = 4096
"""``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``: the reservation's cap on tokens left to decode."""
IGNORE_EOS_RESERVE_TOKENS: Final = 1


def policy_refused(schedule_policy: str, disable_radix_cache: bool) -> str | None:
    """Why SGLang refuses to run ``schedule_policy`` (None: it runs it): the
    ``shortest-prefill-first`` order reads the radix cache's matches."""
    if schedule_policy == "shortest-prefill-first" and disable_radix_cache:
        return (
            "shortest-prefill-first needs the radix cache (SGLang refuses it with "
            "disable_radix_cache)"
        )
    return None


@dataclass(frozen=True)
class LoopConfig:
    """One SGLang server's scheduling knobs (a text-only full-attention model)."""

    max_total_num_tokens: int
    max_running_requests: int
    context_len: int
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    page_size: int = 1
    enable_mixed_chunk: bool = False
    overlap: bool = True
    disable_radix_cache: bool = False
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    priority_scheduling_preemption_threshold: int = 10
    disable_priority_preemption: bool = False
    retraction_policy: str = "length"
    hicache_tokens: int | None = None
    """The host tier's tokens (SGLang's HiCache, write-through; None: off)."""
    load_back_threshold: int = 10
    """The smallest host hit loaded back (SGLang's ``load_back_threshold``)."""
    seed: int = 0
    """The ``random`` order's generator (SGLang shuffles with the process-wide one)."""
    cp_limit: Callable[[int, int, int], str | None] | None = None
    """cpkv's CP shared-KV limits on each prefill batch (not SGLang's): ``(requests, extend
    sum, cached sum)`` with the candidate in it, page-aligned, to the limit it breaks or
    None; None: no limits."""

    def __post_init__(self) -> None:
        for name in ("max_total_num_tokens", "max_running_requests", "context_len", "page_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size < 1:
            raise ValueError(
                f"chunked_prefill_size must be >= 1 or None, got {self.chunked_prefill_size}"
            )
        if self.retraction_policy not in RETRACTION_POLICIES:
            raise ValueError(
                f"retraction_policy must be one of {RETRACTION_POLICIES}, got {self.retraction_policy!r}"
            )
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}"
            )
        problem = policy_refused(self.schedule_policy, self.disable_radix_cache)
        if problem is not None:
            raise ValueError(f"schedule_policy {problem}")

    @property
    def priority_preemption(self) -> bool:
        """Priority scheduling preempts running requests (unless it is disabled)."""
        return self.enable_priority_scheduling and not self.disable_priority_preemption

    @property
    def priority_sign(self) -> int:
        """1 when low priority values go first, else -1 (SGLang's ``priority_sign``)."""
        return 1 if self.schedule_low_priority_values_first else -1

    @property
    def is_mixed_chunk(self) -> bool:
        """SGLang mixes decodes into prefill batches only with chunked prefill on."""
        return self.chunked_prefill_size is not None and self.enable_mixed_chunk
