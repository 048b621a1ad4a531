"""Host-side half of the fast L1 allocator: owner validation and counting from the Python
owner list, cached per-lane free/release counts, the stats computed from them, and the
placement of owner-grouped pages back to request positions.  Shared by the numpy (CPU) and
torch (CUDA) paths of impl ``fast``; nothing here touches lane data.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import add, sub
from typing import Any

import numpy as np

from cpkv.alloc.l1.base import owner_error, room_pages
from cpkv.alloc.l1.state import integrity_error


class OwnerLayout:
    """A request's owner pattern seen before: its per-lane counts and its owner order.

    CP schedulers assign page owners by rule (round robin, zigzag, ...), so the same pattern
    comes back request after request: :class:`OwnerCounter` keeps a bounded table of them per
    ``cp_size``, shared by every allocator of the process (a fresh allocator, as in the cold
    protocol, finds the patterns already seen). ``counts`` is shared: read it, never change it.
    """

    __slots__ = ("counts", "key", "only", "_order")

    def __init__(self, counts: list[int], key: np.ndarray) -> None:
        self.counts, self.key, self._order = counts, key, None
        n = key.size
        self.only = counts.index(n) if n and n in counts else -1  # the one owner, if one

    def __len__(self) -> int:
        return self.key.size

    def order(self) -> np.ndarray:
        if self._order is None:
            self._order = np.argsort(self.key, kind="stable")
            self._order.flags.writeable = False
        return self._order


_LAYOUTS: dict[int, dict[bytes, OwnerLayout]] = {}  # cp_size -> owner bytes -> layout


class OwnerCounter:
    """Validates and counts per-page compute owners (the host-side half of every op)."""

    SMALL = 32  # up to this many owners a Python loop counts fastest
    LARGE = 256  # above this many, numpy's bincount beats one bytes.count per lane
    KEEP = 256  # owner layouts remembered (the table is emptied when it fills up)
    KEEP_MAX_LEN = 1 << 16  # longer owner lists are not remembered

    def __init__(self, cp_size: int) -> None:
        self.cp_size = cp_size
        self._lanes = range(cp_size)
        self._valid = bytes(range(cp_size)) if cp_size <= 256 else b""
        self._layouts = _LAYOUTS.setdefault(cp_size, {})

    def count(self, owners: Sequence[int]) -> tuple[list[int], Any]:
        """(pages per owner, a key for :func:`owner_order`); ValueError for a bad owner.

        The counts may be shared with a remembered layout: callers must not change them.
        """
        if not isinstance(owners, (list, tuple)):
            owners = owners.tolist() if hasattr(owners, "tolist") else list(owners)
        if self.cp_size <= 256:
            try:
                raw = bytearray(owners)  # twice as fast as bytes(list)
            except (TypeError, ValueError):  # negative, >255 or not an int: found below
                raw = None
            if raw is not None and not raw.translate(None, self._valid):
                return self._layout(raw)
        counts = [0] * self.cp_size
        for owner in owners:
            if owner < 0 or owner >= self.cp_size:
                raise owner_error(owner, self.cp_size)
            counts[owner] += 1
        return counts, np.asarray(owners, dtype=np.int64)

    def _layout(self, raw: bytearray) -> tuple[list[int], OwnerLayout]:
        """Counts and layout of valid owner bytes, remembered by their value."""
        signature = bytes(raw)
        layout = self._layouts.get(signature)
        if layout is None:
            key = np.frombuffer(signature, dtype=np.uint8)  # read-only, like the signature
            if len(raw) > self.LARGE:
                counts = np.bincount(key, minlength=self.cp_size).tolist()
            elif len(raw) > self.SMALL:  # no numpy: cheaper when caches are cold
                counts = list(map(raw.count, self._lanes))
            else:
                counts = [0] * self.cp_size
                for owner in raw:
                    counts[owner] += 1
            layout = OwnerLayout(counts, key)
            if len(raw) <= self.KEEP_MAX_LEN:
                if len(self._layouts) >= self.KEEP:
                    self._layouts.clear()
                self._layouts[signature] = layout
        return layout.counts, layout


class HostCounts:
    """Cached per-lane free/release counts and the stats computed from them."""

    physical_pages: int
    cp_size: int

    def _init_counts(self) -> None:
        """Counters for the pool's shape (set by :class:`cpkv.alloc.l1.base.L1Allocator`)."""
        self._owners = OwnerCounter(self.cp_size)
        self._free_counts = [0] * self.cp_size
        self._release_counts = [0] * self.cp_size
        self._rooms: dict[tuple[float, float], tuple[int, int]] = {}

    def available_per_lane(self) -> list[int]:
        """Free + release pages of each lane."""
        return list(map(add, self._free_counts, self._release_counts))

    def compute_owner_lane_stats(
        self, owners: Sequence[int]
    ) -> tuple[list[int], list[int], list[int]]:
        """(required, available, deficit) per lane for a request's page compute owners."""
        required = list(self._owners.count(owners)[0])  # a copy: the caller's to keep
        available = list(map(add, self._free_counts, self._release_counts))
        return required, available, [d if d > 0 else 0 for d in map(sub, required, available)]

    def compute_owner_lane_free_room_stats(
        self, owners: Sequence[int], *, target_ratio: float, trigger_ratio: float
    ) -> tuple[list[int], list[int], list[int]]:
        """(required, available, free-room deficit) per lane (see ``free_room_deficits``)."""
        required = list(self._owners.count(owners)[0])  # a copy: the caller's to keep
        available = list(map(add, self._free_counts, self._release_counts))
        rooms = self._rooms.get((target_ratio, trigger_ratio))
        if rooms is None:
            capacity = self.physical_pages
            rooms = (room_pages(capacity, target_ratio), room_pages(capacity, trigger_ratio))
            self._rooms[(target_ratio, trigger_ratio)] = rooms
        target, trigger = rooms
        deficits = [
            0 if have >= need + trigger else max(0, need + target - have)
            for need, have in zip(required, available, strict=True)
        ]
        return required, available, deficits

    def _check_counts(self, free_sizes: list[int], release_sizes: list[int]) -> None:
        if free_sizes != self._free_counts or release_sizes != self._release_counts:
            raise integrity_error("cached lane counts differ from the lanes")


def owner_order(key: Any) -> np.ndarray:
    """Request positions grouped by owner (ascending), in position order within an owner."""
    if isinstance(key, OwnerLayout):
        return key.order()
    if isinstance(key, bytearray):
        key = np.frombuffer(key, dtype=np.uint8)
    return np.argsort(key, kind="stable")


def placement(key: Any) -> np.ndarray:
    """``rank`` such that position ``p`` takes the ``rank[p]``-th page of the owner-grouped
    list of selected pages (the inverse of :func:`owner_order`)."""
    order = owner_order(key)
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size, dtype=np.int64)
    return rank
