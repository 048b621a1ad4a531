"""What every CP shared paged L1 allocator implementation shares (rules: :mod:`cpkv.alloc.l1.reference`).

Selector names, the free-room rule, the owner error, and :class:`L1Allocator`: the
constructor, the pool's shape attributes, and the select / allocate frame built on the
implementation's plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cpkv.alloc.l1.state import check_shape

SELECTORS = {"fifo": "fifo", "contiguous": "contiguous", "current": "contiguous"}


def canonical_selector(name: str) -> str:
    """``fifo`` or ``contiguous`` for a selector name (``current`` is ``contiguous``)."""
    try:
        return SELECTORS[name]
    except KeyError:
        raise ValueError(f"unknown L1 selector {name!r}; allowed: {', '.join(SELECTORS)}") from None


def room_pages(capacity: int, ratio: float) -> int:
    """``ceil(capacity * ratio)`` pages, or 0 when either is not positive (the seed's rule).
    Computed in floating point as the seed does: ``100 * 0.07`` is 7.000000000000001 -> 8."""
    if capacity <= 0 or ratio <= 0:
        return 0
    return int(math.ceil(float(capacity) * float(ratio)))


def free_room_deficits(
    required: Sequence[int],
    available: Sequence[int],
    capacity: int,
    target_ratio: float,
    trigger_ratio: float,
) -> list[int]:
    """Per lane: 0 while ``available >= required + trigger room``, else the pages missing to
    reach ``required + target room``."""
    target = room_pages(capacity, target_ratio)
    trigger = room_pages(capacity, trigger_ratio)
    return [
        0 if have >= need + trigger else max(0, need + target - have)
        for need, have in zip(required, available, strict=True)
    ]


def owner_error(owner: Any, cp_size: int) -> ValueError:
    """The error for a compute owner outside ``[0, cp_size)``."""
    return ValueError(f"compute owner must be in [0, {cp_size}), got {owner}")


class L1Allocator:
    """Base of the implementations: checks the constructor's arguments, sets the pool's
    shape attributes, and answers ``select``, ``select_token_indices`` and
    ``alloc_pages_with_owners`` from the subclass's hooks:

    * ``_setup(device)``: create the (empty) lanes and set ``self.device``;
    * ``load_free_pages(free_pages)``: fill them;
    * ``_plan(owners)``: ``(selected pages, picks)``, or None when a lane is short;
    * ``_consume(selected, picks)``: take a plan's pages out of the lanes;
    * ``_tokens(selected, picks)``: the token indices of a plan's pages (a torch tensor);
    * ``_page_tensor(selected)``: a plan's pages as a torch tensor (default: as they are).
    """

    DEFAULT_DEVICE = "cpu"

    def __init__(
        self,
        *,
        physical_pages: int,
        page_size: int,
        cp_size: int,
        selector: str = "fifo",
        lane_order: str = "sorted",
        device: Any = None,
        free_pages: Any = None,
    ) -> None:
        """``device`` None: the class's ``DEFAULT_DEVICE``; ``free_pages`` None: all pages."""
        import torch

        check_shape(physical_pages, cp_size, lane_order)
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.physical_pages, self.cp_size, self.page_size = physical_pages, cp_size, page_size
        self.logical_pages = physical_pages * cp_size
        self.selector = canonical_selector(selector)
        self.lane_order = lane_order
        self._sorted = lane_order == "sorted"
        self._setup(torch.device(self.DEFAULT_DEVICE if device is None else device))
        self.load_free_pages(free_pages)

    def _setup(self, device: Any) -> None:
        raise NotImplementedError

    def load_free_pages(self, free_pages: Any = None) -> None:
        """Reset: ``free_pages`` (a flat list, default all pages) become the free lists, the
        release lists empty, and every other page allocated."""
        raise NotImplementedError

    def _plan(self, owners: Sequence[int]) -> Any:
        raise NotImplementedError

    def _consume(self, selected: Any, picks: list) -> None:
        raise NotImplementedError

    def _tokens(self, selected: Any, picks: list) -> Any:
        raise NotImplementedError

    def _page_tensor(self, selected: Any) -> Any:
        return selected

    def select(self, owners: Sequence[int]) -> Any:
        """The logical page chosen for each position, or None when a lane is short."""
        plan = self._plan(owners)
        return None if plan is None else self._page_tensor(plan[0])

    def select_token_indices(self, owners: Sequence[int]) -> Any:
        """The token indices :meth:`alloc_pages_with_owners` would return, consuming nothing."""
        plan = self._plan(owners)
        return None if plan is None else self._tokens(*plan)

    def alloc_pages_with_owners(self, owners: Sequence[int]) -> Any:
        """Select, consume, and return token indices ``page * page_size + offset`` (or None)."""
        plan = self._plan(owners)
        if plan is None:
            return None
        self._consume(*plan)
        return self._tokens(*plan)
