"""The knobs of one admission experiment: SGLang's PrefillAdder budgets plus CP shared-KV limits.

Field names and defaults follow SGLang 0.5.23 server arguments (``--max-prefill-tokens``,
``--chunked-prefill-size``, ``--page-size``, ...) and the seed benchmark's flags. Token
counts that the real allocator holds in whole pages (``available_tokens``,
``evictable_tokens``) are floored to pages by :meth:`AdmitBudgets.allocator_tokens` and
:meth:`AdmitBudgets.other_evictable_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from cpkv.core.schema import Range
from cpkv.core.schema.limits import MAX_TOKENS, TOKENS_WHY, Tokens
from cpkv.workload.request import RunningDecode, floor_page

Positive = Annotated[int, Range(0, MAX_TOKENS, low_open=True, why=TOKENS_WHY)]
"""A size of at least one token (or request): every request holds a token."""
Ratio = Annotated[
    float, Range(0, 1, why="a share of a running request's remaining output; SGLang caps it at 1")
]


@dataclass(frozen=True)
class CpBudgets:
    """Per-batch CP shared-KV limits; each applies only once the batch holds a request.

    Sums are page aligned (``ceil_page`` of each request's extend and cached tokens); a
    request that alone exceeds a limit still runs alone. ``None`` turns a limit off.
    """

    enabled: bool = True
    max_total_extend_tokens: Positive | None = 65536
    max_total_cached_tokens: Positive | None = None
    max_batch_requests: Positive | None = 8

    @property
    def active(self) -> bool:
        """True when CP is on and at least one limit is set."""
        return self.enabled and (
            self.max_total_extend_tokens is not None
            or self.max_total_cached_tokens is not None
            or self.max_batch_requests is not None
        )


@dataclass(frozen=True)
class AdmitBudgets:
    """Everything the PrefillAdder model reads besides the requests.

    * ``available_tokens``: free slots of the L1 (device) allocator.
    * ``evictable_tokens``: other unlocked L1 cache (not any waiting request's prefix);
      the waiting requests' own L1 prefixes are counted on top, as SGLang does.
    * ``chunked_prefill_size``: ``None`` or ``<= 0`` turns chunked prefill off.
    * ``max_running_requests``: caps the running decodes plus this pass's batch.
    * ``load_back_threshold``: an L2 hit shorter than this is recomputed, not loaded.
    * ``load_back_quota_tokens``: optional cap on one load-back (upstream ``mem_quota``;
      SGLang's PrefillAdder passes none, so the real backend refuses it).
    * ``release_each_tick``: at the end of each tick the admitted requests that finished
      their prompt drop their locks, so their L1 tokens (prefix and loaded L2) become
      evictable cache; by default (the seed's model) nothing is released.
    """

    available_tokens: Tokens = 20000
    evictable_tokens: Tokens = 0
    max_prefill_tokens: Positive = 16384
    chunked_prefill_size: Annotated[int, Range(high=MAX_TOKENS, why=TOKENS_WHY)] | None = None
    page_size: Positive = 1
    new_token_ratio: Ratio = 0.7
    max_new_tokens: Tokens = 128
    max_running_requests: Positive | None = None
    prefill_max_requests: Positive | None = None
    load_back_threshold: Tokens = 10
    load_back_quota_tokens: Tokens | None = None
    running: tuple[RunningDecode, ...] = ()
    cp: CpBudgets = CpBudgets()
    release_each_tick: bool = False

    def validate(self) -> None:
        """Every bound is its key's type's (a built config has checked them all)."""

    @property
    def chunk_tokens(self) -> int | None:
        """The chunk budget SGLang starts each pass with (``None``: chunking off)."""
        size = self.chunked_prefill_size
        return size if size is not None and size > 0 else None

    def allocator_tokens(self) -> int:
        """Free L1 slots, in whole pages (the paged allocator holds pages)."""
        return floor_page(self.available_tokens, self.page_size)

    def other_evictable_tokens(self) -> int:
        """The other evictable L1 cache, in whole pages (one radix node)."""
        return floor_page(self.evictable_tokens, self.page_size)

    def running_offset(self) -> float | int:
        """The running decodes' reserved headroom, summed as SGLang sums it.

        ``sum([min(max_new - out, 4096) * ratio ...])``: a float as soon as one running
        request exists (``ratio`` is a float), ``0`` otherwise.
        """
        ratio = float(self.new_token_ratio)
        return sum(
            [
                min(r.max_new_tokens - r.output_len, 4096) * (1.0 if r.ignore_eos else ratio)
                for r in self.running
            ]
        )

    def batch_capacity(self) -> int | None:
        """How many requests one pass may hold (``None``: no cap), from max_running_requests."""
        if self.max_running_requests is None:
            return None
        return self.max_running_requests - len(self.running)
