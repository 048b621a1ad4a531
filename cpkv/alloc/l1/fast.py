"""Fast CP shared paged L1 allocator (impl ``fast``): the reference's answers, less overhead.

Same selections, token indices, ``None`` outcomes, ``ValueError`` outcomes and lane state as
:class:`cpkv.alloc.l1.reference.ReferenceL1Allocator` after every operation.  Where the reference spends
its time (shared/reference/allocator_perf.md §3.3): ~30 small torch calls per request, a
Python loop building per-owner position lists, ``torch.tensor(list)`` and one index_put per
owner.  Here (CPU, numpy):

* owners are validated and counted from ``bytearray(owners)`` (``translate``, then a
  Python loop for short requests and ``bincount`` for long ones);
* lane lists are numpy arrays with an integer head, so consuming a prefix is ``head += k``;
  free/release counts are cached Python ints, so stats never touch the arrays;
* placement is one stable argsort of the owner bytes and one scatter of the joined lane
  pieces (a single-owner request is one slice); expansion is ``repeat`` + tiled offsets;
* ``contiguous`` on sorted lanes is an O(1) test of the prefix (a strictly ascending lane is
  consecutive iff its ends are ``(k - 1) * cp_size`` apart), and one vectorised pass when the
  prefix is broken; on ``as_given`` lanes a bitmap of the lane's physical pages and a cumsum.

On CUDA the same algorithm runs on torch tensors (:mod:`cpkv.alloc.l1.fast_torch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cpkv.alloc.host.fast.pages import ramp
from cpkv.alloc.l1.base import L1Allocator
from cpkv.alloc.l1.owners import HostCounts, OwnerLayout, owner_order
from cpkv.alloc.l1.state import L1Lanes, integrity_error


def has_repeats(pages: np.ndarray, largest: int) -> bool:
    """Whether ``pages`` (values in ``0 .. largest``) holds a value twice; a mark per page for
    long lists, a sort for short ones (numpy's hash-based ``unique`` is slower than both)."""
    if pages.size <= 1:
        return False
    if pages.size * 16 < largest:
        ordered = np.sort(pages)
        return bool(np.count_nonzero(ordered[1:] == ordered[:-1]))
    seen = np.zeros(largest + 1, dtype=bool)
    seen[pages] = True
    return int(np.count_nonzero(seen)) != pages.size


class FastL1Allocator(HostCounts, L1Allocator):
    """Impl ``fast`` on CPU: numpy lanes with heads; the interface of the reference."""

    def _setup(self, device: Any) -> None:
        if device.type != "cpu":
            raise ValueError(f"FastL1Allocator keeps numpy lanes on the CPU, not {device}")
        import torch

        self.device = device
        self._from_numpy = torch.from_numpy
        self._init_counts()
        self._offset_tile = np.empty(0, dtype=np.int64)
        self._templates: dict[int, np.ndarray] = {}

    # -- state ----------------------------------------------------------------------------
    def _as_array(self, values: Any) -> np.ndarray:
        if hasattr(values, "detach"):
            values = values.detach().cpu().numpy()
        return np.asarray(values).reshape(-1)

    def _split(self, pages: np.ndarray) -> list[np.ndarray]:
        """``pages`` by lane, in their order (ascending for sorted lanes)."""
        if self._sorted:
            pages = np.sort(pages)  # a stable split below keeps every lane ascending
        owners = (pages - 1) % self.cp_size
        if self.cp_size <= 256:
            owners = owners.astype(np.uint8)  # radix sort
        grouped = pages[np.argsort(owners, kind="stable")]
        bounds = np.bincount(owners, minlength=self.cp_size).cumsum().tolist()
        return [grouped[a:b] for a, b in zip([0, *bounds[:-1]], bounds, strict=True)]

    def load_free_pages(self, free_pages: Any = None) -> None:
        """Reset: ``free_pages`` (flat; default all) become the free lists, nothing released,
        every other page allocated."""
        if free_pages is None:
            flat = np.arange(1, self.logical_pages + 1, dtype=np.int64)
        else:
            flat = self._as_array(free_pages).astype(np.int64)
            if flat.size and (flat.min() < 1 or flat.max() > self.logical_pages):
                raise ValueError(f"free pages must be in [1, {self.logical_pages}]")
            if has_repeats(flat, self.logical_pages):
                raise ValueError("free pages must not repeat a page")
        self._set_lanes(self._split(flat), [flat[:0]] * self.cp_size, None, flat)

    def _set_lanes(
        self, free: list, release: list, allocated: Any, flat: Any = None, copy: bool = True
    ) -> None:
        # Free lanes are only ever sliced or replaced, never written in place: sharable.
        # Release buffers take appends in place, so they are always copied.
        share = np.asarray if not copy else np.array
        self._free_lanes = [share(lane, dtype=np.int64) for lane in free]
        self._free_heads = [0] * self.cp_size
        self._release_lanes = [np.array(lane, dtype=np.int64) for lane in release]
        self._release_heads = [0] * self.cp_size
        self._release_tails = [lane.size for lane in self._release_lanes]
        self._free_counts = [lane.size for lane in self._free_lanes]
        self._release_counts = list(self._release_tails)
        if allocated is None:
            allocated = np.ones(self.logical_pages + 1, dtype=bool)
            allocated[0] = False
            allocated[flat] = False
        self._allocated = np.array(allocated, dtype=bool)

    def _live_free(self, owner: int) -> np.ndarray:
        return self._free_lanes[owner][self._free_heads[owner] :]

    def _live_release(self, owner: int) -> np.ndarray:
        return self._release_lanes[owner][self._release_heads[owner] : self._release_tails[owner]]

    def snapshot(self) -> Any:
        """An opaque copy of the whole state, for :meth:`restore`."""
        lanes = range(self.cp_size)
        return (
            tuple(self._live_free(o).copy() for o in lanes),
            tuple(self._live_release(o).copy() for o in lanes),
            self._allocated.copy(),
        )

    def restore(self, snapshot: Any, *, copy: bool = True) -> None:
        """Return to a state taken by :meth:`snapshot`.  ``copy=False`` shares the snapshot's
        lane lists, which no operation writes in place (only the allocated mask is copied)."""
        free, release, allocated = snapshot
        self._set_lanes(list(free), list(release), allocated, copy=copy)

    def lanes(self) -> L1Lanes:
        """Free and release lists of every lane, as Python lists in their order."""
        lanes = range(self.cp_size)
        return L1Lanes(
            free=tuple(tuple(self._live_free(o).tolist()) for o in lanes),
            release=tuple(tuple(self._live_release(o).tolist()) for o in lanes),
        )

    def check_integrity(self) -> None:
        """AssertionError unless free, release and allocated partition all pages by lane."""
        lanes = range(self.cp_size)
        free = [self._live_free(o) for o in lanes]
        release = [self._live_release(o) for o in lanes]
        self._check_counts([a.size for a in free], [a.size for a in release])
        count = np.zeros(self.logical_pages + 1, dtype=np.int64)
        for owner in lanes:
            for lane in (free[owner], release[owner]):
                if lane.size and (lane.min() < 1 or lane.max() > self.logical_pages):
                    raise integrity_error(f"lane {owner} holds a page out of range")
                if lane.size and not np.all((lane - 1) % self.cp_size == owner):
                    raise integrity_error(f"lane {owner} holds another lane's page")
                np.add.at(count, lane, 1)
        if count.max() > 1:
            raise integrity_error("a page is listed twice in the free/release lists")
        if np.any((count > 0) & self._allocated):
            raise integrity_error("a page is both free and allocated")
        if self._allocated[0] or not np.all(count[1:] + self._allocated[1:] == 1):
            raise integrity_error("a page is neither free nor allocated")

    # -- selection ------------------------------------------------------------------------
    def _choose(self, live: np.ndarray, need: int) -> Any:
        """Start offset of the chosen slice of ``live``, or an array of positions."""
        if self.selector == "fifo" or need <= 1:
            return 0
        cp, span = self.cp_size, (need - 1) * self.cp_size
        if self._sorted:  # strictly ascending lane: consecutive iff the ends are `span` apart
            if live[need - 1] - live[0] == span:
                return 0
            hits = np.flatnonzero(live[need - 1 :] - live[: live.size - need + 1] == span)
            return int(hits[0]) if hits.size else 0
        if np.all(np.diff(live[:need]) == cp):
            return 0
        ordinals = (live - 1) // cp
        present = np.zeros(self.physical_pages + 1, dtype=np.int32)
        present[ordinals + 1] = 1
        filled = np.cumsum(present)
        hits = np.flatnonzero(filled[need:] - filled[:-need] == need)
        if hits.size == 0:
            return 0
        position = np.empty(self.physical_pages, dtype=np.int64)
        position[ordinals] = np.arange(live.size, dtype=np.int64)
        return position[hits[0] : hits[0] + need]

    def _plan(self, owners: Sequence[int]) -> Any:
        counts, key = self._owners.count(owners)
        total = len(key)
        free_counts, free_lanes, free_heads = self._free_counts, self._free_lanes, self._free_heads
        fifo = self.selector == "fifo"
        only = key.only if type(key) is OwnerLayout else -1
        if only >= 0 and total <= free_counts[only] and (fifo or total == 1):
            head = free_heads[only]  # one owner, its free pages suffice: the lane's prefix
            return free_lanes[only][head : head + total], [(only, 0, total, 0)]
        picks, pieces = [], []
        for owner, need in enumerate(counts):
            if not need:
                continue
            if need <= free_counts[owner]:
                head = free_heads[owner]
                if fifo or need == 1:
                    take = 0
                    pieces.append(free_lanes[owner][head : head + need])
                else:
                    live = free_lanes[owner][head:]
                    take = self._choose(live, need)
                    pieces.append(live[take : take + need] if type(take) is int else live[take])
                picks.append((owner, take, need, 0))
                if need == total:
                    break  # a single-owner request: no other lane has pages to give
                continue
            extra = need - free_counts[owner]
            if extra > self._release_counts[owner]:
                return None
            release_head = self._release_heads[owner]
            pieces += [
                free_lanes[owner][free_heads[owner] :],
                self._release_lanes[owner][release_head : release_head + extra],
            ]
            picks.append((owner, 0, free_counts[owner], extra))
        if len(pieces) == 1:  # a view of a lane: lanes are never written in place
            return pieces[0], picks
        if len(picks) <= 1:
            joined = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
            return joined, picks
        selected = np.empty(total, dtype=np.int64)
        selected[owner_order(key)] = np.concatenate(pieces)
        return selected, picks

    def _page_tensor(self, selected: np.ndarray) -> Any:
        # a single piece is a view of a lane (see _plan): the caller gets its own copy
        return self._from_numpy(selected if selected.base is None else selected.copy())

    def _consume(self, selected: np.ndarray, picks: list) -> None:
        for owner, take, taken, extra in picks:
            if type(take) is int and take == 0:
                self._free_heads[owner] += taken
            else:
                live = self._live_free(owner)
                if type(take) is int:
                    self._free_lanes[owner] = np.concatenate((live[:take], live[take + taken :]))
                else:
                    keep = np.ones(live.size, dtype=bool)
                    keep[take] = False
                    self._free_lanes[owner] = live[keep]
                self._free_heads[owner] = 0
            self._free_counts[owner] -= taken
            if extra:
                self._release_heads[owner] += extra
                self._release_counts[owner] -= extra
        self._allocated[selected] = True

    def _tokens(self, pages: np.ndarray, picks: list) -> Any:
        from_numpy, n = self._from_numpy, pages.size
        if n > 1:
            # Pages in arithmetic progression have tokens that are one template plus a
            # constant (a copy-speed add instead of the repeat-and-add expansion).
            first = pages.item(0)
            span = pages.item(n - 1) - first
            # One lane, free pages only: an ascending slice of a sorted lane, so a run (each
            # page one physical page after the previous) iff its ends are (n - 1) * cp apart.
            cp = self.cp_size
            if span == (n - 1) * cp and self._sorted and len(picks) == 1 and not picks[0][3]:
                return from_numpy(self._template(cp, n) + first * self.page_size)
            if span == n - 1:  # consecutive logical pages? (round-robin over fresh lanes)
                if np.array_equal(pages, ramp(first + n)[first:]):  # one cached table
                    return from_numpy(self._template(1, n) + first * self.page_size)
        return from_numpy(self._expand(pages))

    def _template(self, step: int, count: int) -> np.ndarray:
        """Tokens of pages ``0, step, 2 step, ...`` (``count`` of them), from a cached buffer."""
        size = count * self.page_size
        cached = self._templates.get(step)
        if cached is None or cached.size < size:
            steps = np.arange(count, dtype=np.int64) * (step * self.page_size)
            cached = (steps[:, None] + np.arange(self.page_size)).reshape(-1)
            self._templates[step] = cached
        return cached[:size]

    def _expand(self, pages: np.ndarray) -> np.ndarray:
        """Token indices ``page * page_size + offset`` of ``pages`` (a new array)."""
        size = pages.size * self.page_size
        if self._offset_tile.size < size:
            self._offset_tile = np.tile(np.arange(self.page_size, dtype=np.int64), pages.size)
        tokens = (pages * self.page_size).repeat(self.page_size)
        tokens += self._offset_tile[:size]
        return tokens

    # -- free -----------------------------------------------------------------------------
    def _pages_of_tokens(self, indices: Any) -> np.ndarray:
        tokens = self._as_array(indices)
        if tokens.size == 0:
            return np.empty(0, dtype=np.int64)
        if tokens.dtype.kind not in "iu":
            raise ValueError(f"free: token indices must be integers, got {tokens.dtype}")
        tokens = tokens.astype(np.int64, copy=False)
        ps = self.page_size
        if tokens.size % ps:
            raise ValueError(f"free: {tokens.size} token indices are not whole pages of {ps}")
        pages = tokens[::ps] // ps
        if not np.array_equal(tokens, self._expand(pages)):
            raise ValueError("free: token indices must be whole pages, page * page_size + 0..")
        if pages.min() < 1 or pages.max() > self.logical_pages:
            raise ValueError(f"free: pages must be in [1, {self.logical_pages}]")
        if has_repeats(pages, self.logical_pages):
            raise ValueError("free: a page is given more than once")
        if not self._allocated[pages].all():
            raise ValueError("free: a page is not allocated")
        return pages

    def free(self, indices: Any) -> None:
        """Give back whole allocated pages; each goes to its lane's release list (merged in
        ascending order for ``sorted`` lanes, appended otherwise).  ValueError changes nothing."""
        pages = self._pages_of_tokens(indices)
        if pages.size == 0:
            return
        self._allocated[pages] = False
        for owner, mine in enumerate(self._split(pages)):
            if mine.size:
                self._append_release(owner, mine)

    def _append_release(self, owner: int, pages: np.ndarray) -> None:
        live = self._live_release(owner)
        if self._sorted:
            merged = np.sort(np.concatenate((live, pages)), kind="stable")
            self._release_lanes[owner], self._release_heads[owner], self._release_tails[owner] = (
                merged,
                0,
                merged.size,
            )
        else:
            buffer, tail = self._release_lanes[owner], self._release_tails[owner]
            if tail + pages.size > buffer.size:
                buffer = np.empty(2 * (live.size + pages.size), dtype=np.int64)
                buffer[: live.size] = live
                self._release_lanes[owner], self._release_heads[owner], tail = buffer, 0, live.size
            buffer[tail : tail + pages.size] = pages
            self._release_tails[owner] = tail + pages.size
        self._release_counts[owner] += pages.size
