"""Impl ``fast`` on torch devices (CUDA): the fast algorithm with torch ops only.

The host keeps everything a decision needs: owner counts (from the Python owner list), cached
free/release counts per lane, so ``None`` is decided without reading device memory.  The
device does the data movement: lane slices, one gather for placement (its index is computed
on the host and copied once, from pinned memory, without blocking), the token expansion and
the allocated-mask update.  The ``contiguous`` selector chooses on the device without
branching on device values (``argmax`` of the run test, ``where`` between run and prefix), so
:meth:`TorchFastL1Allocator.alloc_pages_with_owners` never waits for the device: the only
synchronisation left is whatever the caller does with the result.  ``free`` and
``check_integrity`` validate their input and do synchronise.

On a CPU device this class runs the same code (the tests use it that way).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cpkv.alloc.l1 import canonical_selector
from cpkv.alloc.l1_owners import HostCounts, placement
from cpkv.alloc.l1_state import L1Lanes, TorchLaneState


class TorchFastL1Allocator(HostCounts):
    """Impl ``fast`` with torch lanes on any device; the interface of the reference."""

    def __init__(
        self,
        *,
        physical_pages: int,
        page_size: int,
        cp_size: int,
        selector: str = "fifo",
        lane_order: str = "sorted",
        device: Any = "cuda",
        free_pages: Any = None,
    ) -> None:
        import torch

        self._init_counts(physical_pages, cp_size, page_size)
        self._lanes = TorchLaneState(
            physical_pages=physical_pages, cp_size=cp_size, lane_order=lane_order, device=device
        )
        self.device = self._lanes.device
        self.selector = canonical_selector(selector)
        self.lane_order = lane_order
        self._sorted = lane_order == "sorted"
        self._offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        self._arange = torch.arange(0, dtype=torch.int64, device=self.device)
        self.load_free_pages(free_pages)

    # -- state ----------------------------------------------------------------------------
    def _recount(self) -> None:
        self._nfree = [int(t.numel()) for t in self._lanes.free]
        self._nrel = [int(t.numel()) for t in self._lanes.release]

    def load_free_pages(self, free_pages: Any = None) -> None:
        """Reset: ``free_pages`` (flat; default all) become the free lists, nothing released,
        every other page allocated."""
        self._lanes.load(free_pages)
        self._recount()

    def snapshot(self) -> Any:
        """An opaque copy of the whole state, for :meth:`restore`."""
        return self._lanes.snapshot()

    def restore(self, snapshot: Any, *, copy: bool = True) -> None:
        """Return to a state taken by :meth:`snapshot`.  ``copy=False`` shares the snapshot's
        lane lists, which no operation writes in place (only the allocated mask is copied)."""
        self._lanes.restore(snapshot, copy)
        self._recount()

    def lanes(self) -> L1Lanes:
        """Free and release lists of every lane, as Python lists in their order."""
        return self._lanes.lists()

    def check_integrity(self) -> None:
        """AssertionError unless free, release and allocated partition all pages by lane."""
        self._check_counts(
            [int(t.numel()) for t in self._lanes.free],
            [int(t.numel()) for t in self._lanes.release],
        )
        self._lanes.check()

    # -- device helpers -------------------------------------------------------------------
    def _upto(self, size: int) -> Any:
        """``arange(size)`` on the device (a view of a cached, growing buffer)."""
        import torch

        if self._arange.numel() < size:
            self._arange = torch.arange(2 * size, dtype=torch.int64, device=self.device)
        return self._arange[:size]

    def _to_device(self, array: np.ndarray) -> Any:
        """Host array to the device without blocking (pinned staging on CUDA)."""
        import torch

        host = torch.from_numpy(array)
        if self.device.type != "cuda":
            return host.to(self.device)
        return host.pin_memory().to(self.device, non_blocking=True)

    def _contiguous(self, live: Any, need: int) -> Any:
        """Which ``need >= 2`` of ``live`` to take, decided on the device: the prefix if it is
        consecutive, else the lowest addressed run, else the prefix.  For sorted lanes the
        start of a slice (a device scalar), otherwise the positions (a device tensor)."""
        import torch

        size, span, steps = int(live.numel()), (need - 1) * self.cp_size, self._upto(need)
        if self._sorted:
            hits = (live[need - 1 :] - live[: size - need + 1]) == span
            return torch.argmax(hits.to(torch.uint8))  # the first hit; 0 (the prefix) if none
        prefix_ok = torch.all(live[1:need] - live[: need - 1] == self.cp_size)
        ordered, order = torch.sort(live, stable=True)
        hits = (ordered[need - 1 :] - ordered[: size - need + 1]) == span
        start = torch.argmax(hits.to(torch.uint8))
        return torch.where(hits.any() & ~prefix_ok, order[start + steps], steps)

    def _taken(self, live: Any, need: int, take: Any) -> Any:
        if take is None:
            return live[:need]
        return live[take + self._upto(need)] if take.dim() == 0 else live[take]

    def _rest(self, live: Any, need: int, take: Any) -> Any:
        """``live`` without the ``need`` pages chosen by ``take`` (order kept)."""
        import torch

        size = int(live.numel())
        if take is None:
            return live[need:]
        if take.dim() == 0:
            rest = self._upto(size - need)
            return live[rest + need * (rest >= take).to(torch.int64)]
        taken = torch.zeros((size,), dtype=torch.uint8, device=self.device)
        taken.index_fill_(0, take, 1)
        return live[torch.argsort(taken, stable=True)[: size - need]]

    # -- selection ------------------------------------------------------------------------
    def _plan(self, owners: Sequence[int]) -> Any:
        import torch

        counts, key = self._owners.count(owners)
        lanes = self._lanes
        picks, pieces = [], []
        for owner, need in enumerate(counts):
            if not need:
                continue
            have, live = self._nfree[owner], lanes.free[owner]
            if need <= have:
                contiguous = self.selector == "contiguous" and need > 1
                take = self._contiguous(live, need) if contiguous else None
                pieces.append(self._taken(live, need, take))
                picks.append((owner, take, need, 0))
                continue
            extra = need - have
            if extra > self._nrel[owner]:
                return None
            pieces += [live, lanes.release[owner][:extra]]
            picks.append((owner, None, have, extra))
        if len(pieces) <= 1:
            empty = torch.empty((0,), dtype=torch.int64, device=self.device)
            return (pieces[0].clone() if pieces else empty), picks
        joined = torch.cat(pieces)
        if len(picks) == 1:
            return joined, picks
        return joined[self._to_device(placement(key))], picks

    def select(self, owners: Sequence[int]) -> Any:
        """The logical page chosen for each position, or None when a lane is short."""
        plan = self._plan(owners)
        return None if plan is None else plan[0]

    def select_token_indices(self, owners: Sequence[int]) -> Any:
        """The token indices :meth:`alloc_pages_with_owners` would return, consuming nothing."""
        plan = self._plan(owners)
        return None if plan is None else self._tokens(plan[0])

    def alloc_pages_with_owners(self, owners: Sequence[int]) -> Any:
        """Select, consume, and return token indices ``page * page_size + offset`` (or None);
        no host/device synchronisation."""
        plan = self._plan(owners)
        if plan is None:
            return None
        selected, picks = plan
        lanes = self._lanes
        for owner, take, taken, extra in picks:
            lanes.free[owner] = self._rest(lanes.free[owner], taken, take)
            self._nfree[owner] -= taken
            if extra:
                lanes.release[owner] = lanes.release[owner][extra:]
                self._nrel[owner] -= extra
        lanes.allocated.index_fill_(0, selected, True)
        return self._tokens(selected)

    def _tokens(self, pages: Any) -> Any:
        return (pages.unsqueeze(1) * self.page_size + self._offsets).reshape(-1)

    def free(self, indices: Any) -> None:
        """Give back whole allocated pages (validated: this synchronises); each goes to its
        lane's release list.  ValueError changes nothing."""
        self._lanes.release_pages(self._lanes.pages_of_tokens(indices, self.page_size))
        self._nrel = [int(t.numel()) for t in self._lanes.release]
