"""The CP shared paged L1 allocator (context-parallel shared KV): reference implementation.

``physical_pages * cp_size`` logical pages, numbered from 1.  Page ``p`` belongs to owner lane
``(p - 1) % cp_size`` and sits at physical page ``(p - 1) // cp_size + 1`` of that lane; a
lane holds ``physical_pages`` pages (its capacity).  Each lane keeps an ordered *free* list and
an ordered *release* list (pages given back by :meth:`free`); available = free + release.

Selection for a request (one compute owner per requested page): a lane that must supply ``k``
pages takes them from its free list first and, when the free list is shorter than ``k``, all
of its free pages followed by the first ``k - free`` release pages.  The request fails (``None``)
when any lane has fewer than ``k`` available pages.  A lane's pages go to the positions of its
owner in position order.  Which ``k`` free pages (when the free list has at least ``k``):

* ``fifo``: the first ``k`` of the free list.
* ``contiguous`` (alias ``current``, the seed's name): the first ``k`` when they are already
  physically consecutive (each one physical page after the previous); otherwise the lowest
  addressed run of ``k`` physically consecutive free pages of the lane, in ascending order;
  when the lane has no such run, the first ``k``.

The seed's standalone ``current`` selector is a plain FIFO prefix; this one really prefers
contiguity.  With sorted lanes and no holes the prefix is always consecutive, so the two agree.

Lane order (how a flat free list is split into lanes): ``sorted`` (the seed: every lane is
sorted ascending, and released pages are merged in ascending order) or ``as_given`` (lanes keep
the order of the flat list, and released pages are appended in the order freed).

Allocated pages are tracked, so :meth:`free` rejects (ValueError, nothing changed) tokens that
are not whole allocated pages, and ``check_integrity()`` can prove that free, release and
allocated partition the pages lane by lane.

This module holds the reference (plain torch, any device, mirrors the seed's control path), the
factory :func:`make_l1_allocator` and the bench's helpers.  What every implementation shares
(the constructor, the select/allocate frame, the free-room rule) is in :mod:`cpkv.alloc.l1.base`;
the fast implementation is in :mod:`cpkv.alloc.l1.fast`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cpkv.alloc.l1.base import SELECTORS, L1Allocator, free_room_deficits, owner_error
from cpkv.alloc.l1.state import LANE_ORDERS, TorchLanes

__all__ = [
    "IMPLS",
    "LANE_ORDERS",
    "SELECTORS",
    "ReferenceL1Allocator",
    "is_selection_contiguous",
    "make_l1_allocator",
    "resolve_device",
]


def is_selection_contiguous(pages: Sequence[int] | None, cp_size: int) -> bool:
    """The seed's contiguity test: a non-empty selection (one logical page per position) whose
    pages of each owner lane, in position order, are physically consecutive."""
    if pages is None or len(pages) == 0:
        return False
    last: dict[int, int] = {}
    for page in [int(p) for p in pages]:
        owner, ordinal = (page - 1) % cp_size, (page - 1) // cp_size
        if owner in last and ordinal != last[owner] + 1:
            return False
        last[owner] = ordinal
    return True


def resolve_device(name: str, key: str = "device") -> Any:
    """The torch device for ``name`` (``cpu``, ``cuda``, ``cuda:N``).  ConfigError for anything
    else; UnsupportedError for CUDA on a machine without it."""
    import torch

    from cpkv.core.errors import ConfigError, UnsupportedError

    allowed = "allowed: cpu, cuda, cuda:N"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{key}: {name!r} is not a device; {allowed}") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"{key}: {name!r} is not supported; {allowed}")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UnsupportedError(
            f"{key}: {name!r} requested but CUDA is not available here "
            f"(torch {torch.__version__}); use device=cpu"
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ConfigError(f"{key}: {name!r}: only {torch.cuda.device_count()} CUDA devices")
    return torch.device("cuda", index)


class ReferenceL1Allocator(TorchLanes, L1Allocator):
    """The reference allocator: per-lane torch tensors, the seed's per-owner control path."""

    def available_per_lane(self) -> list[int]:
        """Free + release pages of each lane."""
        return [
            int(f.numel() + r.numel())
            for f, r in zip(self._lanes.free, self._lanes.release, strict=True)
        ]

    # -- stats ----------------------------------------------------------------------------
    def compute_owner_lane_stats(
        self, owners: Sequence[int]
    ) -> tuple[list[int], list[int], list[int]]:
        """(required, available, deficit) per lane for a request's page compute owners."""
        required = [0] * self.cp_size
        for owner in owners:
            if owner < 0 or owner >= self.cp_size:
                raise owner_error(owner, self.cp_size)
            required[owner] += 1
        available = self.available_per_lane()
        return (
            required,
            available,
            [max(0, r - a) for r, a in zip(required, available, strict=True)],
        )

    def compute_owner_lane_free_room_stats(
        self, owners: Sequence[int], *, target_ratio: float, trigger_ratio: float
    ) -> tuple[list[int], list[int], list[int]]:
        """(required, available, free-room deficit) per lane; see :func:`free_room_deficits`."""
        required, available, _ = self.compute_owner_lane_stats(owners)
        deficits = free_room_deficits(
            required, available, self.physical_pages, target_ratio, trigger_ratio
        )
        return required, available, deficits

    # -- selection ------------------------------------------------------------------------
    def _choose(self, free: Any, need: int) -> Any:
        """Which of ``need <= len(free)`` free pages to take: a slice or a position tensor."""
        import torch

        if self.selector == "fifo" or need <= 1:
            return slice(0, need)
        cp = self.cp_size
        prefix = free[:need]
        if bool(torch.all(prefix[1:] - prefix[:-1] == cp)):
            return slice(0, need)
        if self.lane_order == "sorted":
            ordered, order = free, None
        else:
            ordered, order = torch.sort(free, stable=True)
        span = ordered[need - 1 :] - ordered[: free.numel() - need + 1]
        hits = torch.nonzero(span == (need - 1) * cp)
        if hits.numel() == 0:
            return slice(0, need)
        start = int(hits[0, 0])
        return slice(start, start + need) if order is None else order[start : start + need]

    def _plan(self, owners: Sequence[int]) -> Any:
        import torch

        cp = self.cp_size
        required = [0] * cp
        positions: list[list[int]] = [[] for _ in range(cp)]
        for position, owner in enumerate(owners):
            if owner < 0 or owner >= cp:
                raise owner_error(owner, cp)
            required[owner] += 1
            positions[owner].append(position)
        picks = []
        for owner, need in enumerate(required):
            if need == 0:
                continue
            free, release = self._lanes.free[owner], self._lanes.release[owner]
            have = int(free.numel())
            take = self._choose(free, need) if need <= have else slice(0, have)
            pages = free[take]
            extra = need - int(pages.numel())
            if extra > 0:
                if extra > int(release.numel()):
                    return None
                pages = torch.cat((pages, release[:extra]))
            picks.append((owner, take, extra, pages))
        selected = torch.empty((len(owners),), dtype=torch.int64, device=self.device)
        for owner, _, _, pages in picks:
            where = torch.tensor(positions[owner], dtype=torch.int64, device=self.device)
            selected[where] = pages
        return selected, picks

    def _consume(self, selected: Any, picks: list) -> None:
        for owner, take, extra, _ in picks:
            self._lanes.remove_free(owner, take)
            if extra:
                self._lanes.release[owner] = self._lanes.release[owner][extra:]
        self._lanes.allocated[selected] = True

    def _tokens(self, selected: Any, picks: list) -> Any:
        import torch

        offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (selected.unsqueeze(1) * self.page_size + offsets.unsqueeze(0)).reshape(-1)


IMPLS = ("reference", "fast")


def make_l1_allocator(impl: str, **kwargs: Any) -> Any:
    """An L1 allocator by implementation name (``reference`` or ``fast``); ``kwargs`` are the
    constructor's (``physical_pages``, ``page_size``, ``cp_size``, ``selector``,
    ``lane_order``, ``device``, ``free_pages``).  ``fast`` keeps numpy lanes on a CPU device
    and torch lanes on any other."""
    import torch

    if impl == "reference":
        return ReferenceL1Allocator(**kwargs)
    if impl != "fast":
        raise ValueError(f"unknown L1 impl {impl!r}; allowed: {', '.join(IMPLS)}")
    if torch.device(kwargs.get("device", "cpu")).type == "cpu":
        from cpkv.alloc.l1.fast import FastL1Allocator

        return FastL1Allocator(**kwargs)
    from cpkv.alloc.l1.fast_torch import TorchFastL1Allocator

    return TorchFastL1Allocator(**kwargs)
