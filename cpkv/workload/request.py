"""Waiting prefill requests and already-running decodes, as the admission model sees them.

A :class:`Request` is the seed's three token counts: ``l1_cached_tokens`` hit in the device
(L1) radix cache, ``l2_cached_tokens`` hit only in the host (L2) cache right after them, and
``extend_tokens`` that no cache covers. It maps to SGLang as

* fill length ``L = l1 + l2 + extend``;
* device prefix ``D = floor_page(l1)``;
* host hit ``H = floor_page(l1 + l2) - D``;
* ``extend_input_len = L - D``.

With ``page_size = 1`` this is exactly the seed's mapping (``D = l1``, ``H = l2``). With
larger pages the real radix tree only matches whole pages, so a partial last page of the L1
hit is served from L2 (the host copy covers it: HiCache writes through) and a partial last
page of the L2 hit is recomputed. ``L`` never changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from cpkv.core.errors import InputError
from cpkv.core.fastinit import fast_constructor
from cpkv.core.schema.limits import Tokens

CLIP_MAX_NEW_TOKENS: Final = 4096
"""SGLang's ``CLIP_MAX_NEW_TOKENS``: admission estimates clip ``max_new_tokens`` to this."""


@dataclass(frozen=True)
class Request:
    """One waiting request; ``max_new_tokens=None`` takes the budget's default."""

    rid: str
    l1_cached_tokens: int = 0
    l2_cached_tokens: int = 0
    extend_tokens: int = 1
    max_new_tokens: int | None = None
    priority: int = 0
    arrival_ms: float = 0.0
    deadline_ms: float | None = None  # mode serving: TTFT deadline after arrival (cpkv)
    cancel_ms: float | None = None  # mode serving: the client cancels this long after arrival

    def __post_init__(self) -> None:
        bad = (
            self.extend_tokens < 1
            or self.l1_cached_tokens < 0
            or self.l2_cached_tokens < 0
            or (self.max_new_tokens is not None and self.max_new_tokens < 0)
        )
        if bad:
            raise InputError(
                f"request {self.rid!r}: needs extend_tokens >= 1 (SGLang always computes a token) "
                f"and l1/l2_cached_tokens, max_new_tokens >= 0; got {self.l1_cached_tokens}/"
                f"{self.l2_cached_tokens}/{self.extend_tokens}/{self.max_new_tokens}"
            )

    @property
    def fill_tokens(self) -> int:
        """``L``: every token of the prompt, cached or not."""
        return self.l1_cached_tokens + self.l2_cached_tokens + self.extend_tokens


new_request = fast_constructor(Request)
"""``Request(rid, l1, l2, extend, max_new, priority, arrival_ms)`` for bulk loading of values
already checked (all fields given; ``__post_init__`` is skipped)."""


@dataclass(frozen=True, slots=True)
class RunningDecode:
    """A decode already running: it reserves ``min(max_new - output, 4096) * ratio`` tokens.

    ``ratio`` is ``new_token_ratio``, or 1.0 when ``ignore_eos`` (SGLang 0.5.23).
    """

    max_new_tokens: Tokens = 128
    output_len: Tokens = 0
    ignore_eos: bool = False


def floor_page(tokens: int, page_size: int) -> int:
    """``tokens`` rounded down to whole pages."""
    return tokens // page_size * page_size


def ceil_page(tokens: int, page_size: int) -> int:
    """``tokens`` rounded up to whole pages."""
    return -(-tokens // page_size) * page_size


def ceil_div(tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` tokens needed to hold ``tokens``."""
    return -(-tokens // block_size)


def device_and_host_hit(req: Request, page_size: int) -> tuple[int, int]:
    """``(D, H)``: the page-aligned L1 prefix and the L2 hit right after it."""
    d = floor_page(req.l1_cached_tokens, page_size)
    return d, floor_page(req.l1_cached_tokens + req.l2_cached_tokens, page_size) - d
