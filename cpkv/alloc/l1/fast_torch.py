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

from cpkv.alloc.l1.base import L1Allocator
from cpkv.alloc.l1.owners import HostCounts, placement
from cpkv.alloc.l1.state import TorchLanes


class TorchFastL1Allocator(TorchLanes, HostCounts, L1Allocator):
    """Impl ``fast`` with torch lanes on any device; the interface of the reference."""

    DEFAULT_DEVICE = "cuda"

    def _setup(self, device: Any) -> None:
        import torch

        self._init_counts()
        super()._setup(device)
        self._offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        self._arange = torch.arange(0, dtype=torch.int64, device=self.device)

    def _lanes_changed(self) -> None:
        self._free_counts = [int(t.numel()) for t in self._lanes.free]
        self._release_counts = [int(t.numel()) for t in self._lanes.release]

    def check_integrity(self) -> None:
        """AssertionError unless free, release and allocated partition all pages by lane."""
        self._check_counts(
            [int(t.numel()) for t in self._lanes.free],
            [int(t.numel()) for t in self._lanes.release],
        )
        super().check_integrity()

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
            have, live = self._free_counts[owner], lanes.free[owner]
            if need <= have:
                contiguous = self.selector == "contiguous" and need > 1
                take = self._contiguous(live, need) if contiguous else None
                pieces.append(self._taken(live, need, take))
                picks.append((owner, take, need, 0))
                continue
            extra = need - have
            if extra > self._release_counts[owner]:
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

    def _consume(self, selected: Any, picks: list) -> None:
        lanes = self._lanes
        for owner, take, taken, extra in picks:
            lanes.free[owner] = self._rest(lanes.free[owner], taken, take)
            self._free_counts[owner] -= taken
            if extra:
                lanes.release[owner] = lanes.release[owner][extra:]
                self._release_counts[owner] -= extra
        lanes.allocated.index_fill_(0, selected, True)

    def _tokens(self, selected: Any, picks: list) -> Any:
        return (selected.unsqueeze(1) * self.page_size + self._offsets).reshape(-1)
