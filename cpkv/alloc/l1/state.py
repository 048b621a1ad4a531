"""Lane state of the CP shared paged L1 allocator kept as torch tensors (any device).

Used by the reference allocator (:mod:`cpkv.alloc.l1.reference`) and by the torch path of the fast one.
One free and one release tensor per owner lane, and an ``allocated`` mask over logical pages
(index 0 unused).  See :mod:`cpkv.alloc.l1.reference` for the layout of pages and lanes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LANE_ORDERS = ("sorted", "as_given")


@dataclass(frozen=True)
class L1Lanes:
    """Free and release lists of every owner lane, in list order (for tests and reports)."""

    free: tuple[tuple[int, ...], ...]
    release: tuple[tuple[int, ...], ...]


def check_shape(physical_pages: int, cp_size: int, lane_order: str) -> None:
    """ValueError unless the pool shape and lane order are acceptable."""
    if physical_pages < 1:
        raise ValueError(f"physical_pages must be >= 1, got {physical_pages}")
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1, got {cp_size}")
    if lane_order not in LANE_ORDERS:
        raise ValueError(f"unknown lane order {lane_order!r}; allowed: {', '.join(LANE_ORDERS)}")


def integrity_error(message: str) -> AssertionError:
    """The error :meth:`check_integrity` raises."""
    return AssertionError(f"L1 allocator integrity: {message}")


class TorchLaneState:
    """Per-lane free/release tensors plus an allocated mask, on one torch device."""

    def __init__(self, *, physical_pages: int, cp_size: int, lane_order: str, device: Any) -> None:
        import torch

        check_shape(physical_pages, cp_size, lane_order)
        self.physical_pages, self.cp_size, self.lane_order = physical_pages, cp_size, lane_order
        self.logical_pages = physical_pages * cp_size
        self.device = torch.device(device)
        self.free: list[Any] = []
        self.release: list[Any] = []
        self.allocated: Any = None

    def _empty(self) -> Any:
        import torch

        return torch.empty((0,), dtype=torch.int64, device=self.device)

    def flat_pages(self, pages: Any) -> Any:
        """``pages`` (None = all) as a validated 1-D int64 tensor on the device."""
        import torch

        if pages is None:
            return torch.arange(1, self.logical_pages + 1, dtype=torch.int64, device=self.device)
        flat = torch.as_tensor(pages).to(device=self.device, dtype=torch.int64).reshape(-1)
        if flat.numel():
            if int(flat.min()) < 1 or int(flat.max()) > self.logical_pages:
                raise ValueError(f"free pages must be in [1, {self.logical_pages}]")
            if int(torch.unique(flat).numel()) != int(flat.numel()):
                raise ValueError("free pages must not repeat a page")
        return flat

    def split(self, pages: Any) -> list[Any]:
        """``pages`` split into lanes, keeping their order (sorted when lane order says so)."""
        import torch

        owners = torch.remainder(pages - 1, self.cp_size)
        lanes = [pages[owners == owner] for owner in range(self.cp_size)]
        if self.lane_order == "sorted":
            lanes = [torch.sort(lane).values for lane in lanes]
        return lanes

    def load(self, pages: Any) -> None:
        """Free lists from a flat list; release lists empty; every other page allocated."""
        import torch

        flat = self.flat_pages(pages)
        self.free = self.split(flat)
        self.release = [self._empty() for _ in range(self.cp_size)]
        self.allocated = torch.ones((self.logical_pages + 1,), dtype=torch.bool, device=self.device)
        self.allocated[0] = False
        self.allocated[flat] = False

    def snapshot(self) -> Any:
        return (
            tuple(t.clone() for t in self.free),
            tuple(t.clone() for t in self.release),
            self.allocated.clone(),
        )

    def restore(self, snapshot: Any, copy: bool = True) -> None:
        """Lanes from a snapshot; lane tensors are only ever replaced, never written in place,
        so ``copy=False`` may share them (the allocated mask is always copied)."""
        free, release, allocated = snapshot
        self.free = [t.clone() for t in free] if copy else list(free)
        self.release = [t.clone() for t in release] if copy else list(release)
        self.allocated = allocated.clone()

    def lists(self) -> L1Lanes:
        return L1Lanes(
            free=tuple(tuple(t.tolist()) for t in self.free),
            release=tuple(tuple(t.tolist()) for t in self.release),
        )

    def remove_free(self, owner: int, take: Any) -> None:
        """Drop the chosen entries (a slice or a position tensor) from a lane's free list."""
        import torch

        free = self.free[owner]
        if isinstance(take, slice):
            if take.start == 0:
                self.free[owner] = free[take.stop :]
            else:
                self.free[owner] = torch.cat((free[: take.start], free[take.stop :]))
            return
        keep = torch.ones((free.numel(),), dtype=torch.bool, device=self.device)
        keep[take] = False
        self.free[owner] = free[keep]

    def pages_of_tokens(self, indices: Any, page_size: int) -> Any:
        """The allocated pages behind whole-page token indices; ValueError for anything else."""
        import torch

        tokens = torch.as_tensor(indices).to(device=self.device).reshape(-1)
        if tokens.numel() == 0:
            return torch.empty((0,), dtype=torch.int64, device=self.device)
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise ValueError(f"free: token indices must be integers, got {tokens.dtype}")
        tokens = tokens.to(torch.int64)
        if tokens.numel() % page_size:
            raise ValueError(
                f"free: {tokens.numel()} token indices are not whole pages of {page_size}"
            )
        rows = tokens.view(-1, page_size)
        pages = torch.div(rows[:, 0], page_size, rounding_mode="floor")
        offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        if not torch.equal(rows, pages.unsqueeze(1) * page_size + offsets):
            raise ValueError("free: token indices must be whole pages, page * page_size + 0..")
        if int(pages.min()) < 1 or int(pages.max()) > self.logical_pages:
            raise ValueError(f"free: pages must be in [1, {self.logical_pages}]")
        if int(torch.unique(pages).numel()) != int(pages.numel()):
            raise ValueError("free: a page is given more than once")
        if not bool(self.allocated[pages].all()):
            raise ValueError("free: a page is not allocated")
        return pages

    def release_pages(self, pages: Any) -> None:
        """Move validated allocated pages to their lanes' release lists."""
        import torch

        if pages.numel() == 0:
            return
        self.allocated[pages] = False
        for owner, mine in enumerate(self.split(pages)):
            if mine.numel():
                merged = torch.cat((self.release[owner], mine))
                if self.lane_order == "sorted":
                    merged = torch.sort(merged).values
                self.release[owner] = merged

    def check(self) -> None:
        """AssertionError unless free, release and allocated partition all pages by lane."""
        import torch

        count = torch.zeros((self.logical_pages + 1,), dtype=torch.int64, device=self.device)
        for owner in range(self.cp_size):
            for lane in (self.free[owner], self.release[owner]):
                if lane.numel() == 0:
                    continue
                if int(lane.min()) < 1 or int(lane.max()) > self.logical_pages:
                    raise integrity_error(f"lane {owner} holds a page out of range")
                if not bool(torch.all(torch.remainder(lane - 1, self.cp_size) == owner)):
                    raise integrity_error(f"lane {owner} holds another lane's page")
                count.index_add_(0, lane, torch.ones_like(lane))
        if int(count.max()) > 1:
            raise integrity_error("a page is listed twice in the free/release lists")
        if bool((count.bool() & self.allocated).any()):
            raise integrity_error("a page is both free and allocated")
        if bool(self.allocated[0]) or not bool(
            torch.all(count[1:] + self.allocated[1:].to(torch.int64) == 1)
        ):
            raise integrity_error("a page is neither free nor allocated")


class TorchLanes:
    """The lane half of an allocator whose lanes are a :class:`TorchLaneState` (the reference
    and the fast impl on torch): setup, load, snapshot/restore, lists, free and the check.
    ``_lanes_changed()`` runs after every change not made by an allocation."""

    physical_pages: int
    cp_size: int
    page_size: int
    lane_order: str
    _lanes: TorchLaneState

    def _setup(self, device: Any) -> None:
        self._lanes = TorchLaneState(
            physical_pages=self.physical_pages,
            cp_size=self.cp_size,
            lane_order=self.lane_order,
            device=device,
        )
        self.device = self._lanes.device

    def _lanes_changed(self) -> None:
        """Hook: after load, restore or free (caches of lane counts refresh here)."""

    def load_free_pages(self, free_pages: Any = None) -> None:
        """Reset: ``free_pages`` (a flat list, default all pages) become the free lists, the
        release lists empty, and every other page allocated."""
        self._lanes.load(free_pages)
        self._lanes_changed()

    def snapshot(self) -> Any:
        """An opaque copy of the whole state, for :meth:`restore`."""
        return self._lanes.snapshot()

    def restore(self, snapshot: Any, *, copy: bool = True) -> None:
        """Return to a state taken by :meth:`snapshot`.  ``copy=False`` shares the snapshot's
        lane lists, which no operation writes in place (only the allocated mask is copied)."""
        self._lanes.restore(snapshot, copy)
        self._lanes_changed()

    def lanes(self) -> L1Lanes:
        """Free and release lists of every lane, as Python lists in their order."""
        return self._lanes.lists()

    def check_integrity(self) -> None:
        """AssertionError unless every page is in exactly one of: its own lane's free
        list, its lane's release list, the allocated set."""
        self._lanes.check()

    def free(self, indices: Any) -> None:
        """Give back whole allocated pages (token indices as returned by an alloc); each page
        goes to its lane's release list.  ValueError for anything else, changing nothing."""
        self._lanes.release_pages(self._lanes.pages_of_tokens(indices, self.page_size))
        self._lanes_changed()
