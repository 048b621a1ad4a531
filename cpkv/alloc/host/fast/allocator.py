"""Fast host (L2) KV allocator (impl ``fast``): the reference's answers without its rescans.

Same selections (same slots, same order), same ``None``/``ValueError`` outcomes and the same
logical free list as :class:`cpkv.alloc.host.reference.HostAllocator` after every call. The reference
spends ~99% of a contiguous-preferred call on passes over every free slot
(shared/reference/allocator_perf.md §3.1); this keeps an incremental page index (design "D",
:class:`cpkv.alloc.host.fast.queue.PageQueue`):

* FIFO selections from the caller's adopted slots are views of them, as in the reference;
* the search is :func:`cpkv.alloc.host.fast.firstfit.first_fit` over the free-page bitmap; once no
  run of ``k`` pages exists, none of ``k`` or more does until the next free (``_nofit``);
* the first selection of a page run is a view of the allocator's own slot table, later ones
  are copies (:class:`cpkv.alloc.host.fast.handouts.RunSlots`);
* ``free`` of a selection handed out and not written since (torch's version counter) learns
  its pages from its address or from a receipt instead of reading its slots
  (:mod:`cpkv.alloc.host.fast.handouts`); anything else is read and checked in full.

Invariant: the free list is made of whole aligned pages (slots ``p*ps .. p*ps+ps-1``), each
page at most once. Allocations keep it; construction and every ``free`` check it. When a
free list or a freed tensor breaks it (partial or unaligned pages, a page freed twice,
another dtype), ``fallback_reason`` says why and the exact logical free list goes to the
reference algorithm, which answers every later call: same results, only slower.

What differs from the reference apart from speed is object identity and memory: the first
selection of a page run is a view of the allocator's slot table (8 bytes per pool slot,
17.6 MB at 220 GB, built at construction and kept alive by any view of it) where the
reference returns a new tensor; no two selections ever share memory, as in the reference.
Frees trust torch's version counter: a selection written *behind torch's back*
(``.numpy()``, ``.data``, raw storage) and then freed is freed as it was handed out, where
the reference would free what it holds now.

Construction does everything that does not depend on a call: checking the free list, the
index, the slot table (~6-12 ms more than before the table, untimed in both protocols); the
timed calls do the selection and free-list work, including the lazy parts (FIFO clears the
bitmap bits of its pages at the next search or free, as in design D). Construction's last
step is the view of the adopted slots that FIFO selections are sliced from, because every
FIFO selection needs it; in the seed's cold protocol (an untimed 17.6 MB clone and
construction before each timed call) that also leaves torch's slicing path warm for the
first call, as the reference's clone leaves its own torch paths warm. Nothing is called only
to warm a cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cpkv.alloc.host.fast.firstfit import first_fit
from cpkv.alloc.host.fast.handouts import KnownSlots, version_of
from cpkv.alloc.host.fast.pages import PageCheck, as_numpy, expand, is_run
from cpkv.alloc.host.fast.queue import PageQueue


class FastHostAllocator(PageQueue):
    """Impl ``fast``: an incremental page index over the reference's free list (numpy, CPU)."""

    name = "fast"

    def __init__(self, page_size: int, free_slots: Any) -> None:
        import torch

        self._torch = torch
        self.page_size = int(page_size)
        if self.page_size <= 0:
            raise ValueError(f"page_size must be > 0, got {page_size}")
        self.exact: Any = None
        self.fallback_reason: str | None = None
        self._checker = PageCheck(self.page_size)
        pages, problem = self._adopt(free_slots)
        problem = problem or self._index(pages)
        if problem:
            self._fall_back(free_slots, problem)
            return
        n = pages.shape[0]  # n pages are all of free_slots
        self._adopted, self._adopted_pages = KnownSlots(free_slots, self.page_size, n), pages
        # Last: the view FIFO selections are sliced from (the caller's slots, not copied).
        self._store, self._store_rows = free_slots[: n * self.page_size], n

    # -- construction and fallback --------------------------------------------------------
    def _adopt(self, slots: Any) -> tuple[Any, str | None]:
        torch = self._torch
        if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int64 or slots.dim() != 1:
            return None, "the free list is not a 1-D int64 tensor"
        if slots.device.type != "cpu":
            return None, f"the free list is on {slots.device}, not the CPU"
        pages = self._checker.pages(slots.contiguous().numpy())
        if pages is None:
            return None, "the free list is not made of whole aligned pages"
        return pages, None

    def _fall_back(self, slots: Any, reason: str) -> None:
        from cpkv.alloc.host.reference import HostAllocator

        self.exact = HostAllocator(self.page_size, slots)
        self.fallback_reason = reason

    # -- the interface ----------------------------------------------------------------------
    @property
    def free_slots(self) -> Any:
        """The logical free list as a 1-D int64 tensor of slots (built on demand)."""
        if self.exact is not None:
            return self.exact.free_slots
        return self._torch.from_numpy(expand(self._live_pages(), self.page_size, self._table))

    def available_size(self) -> int:
        if self.exact is not None:
            return self.exact.available_size()
        return self._live * self.page_size

    def free_slot_list(self) -> list[int]:
        return self.free_slots.tolist()

    def alloc(self, need_size: int) -> Any:
        """FIFO: the first ``need_size`` slots of the free list; None when there are fewer."""
        if self.exact is not None:
            return self.exact.alloc(need_size)
        k = self._pages_for(need_size)
        if k > self._live:
            return None
        head = self._head
        if not self._ndead:  # the common case, inline: a view of the adopted slots
            end, row0 = head + k, self._store_row0
            if head >= row0 and end <= row0 + self._store_rows:
                self._head, self._live, ps = end, self._live - k, self.page_size
                out = self._store[(head - row0) * ps : (end - row0) * ps]
                self._last_view = (out, head - row0, end - row0, False)
                return out
        end, skipped = self._window(k)
        return self._take(end, skipped, k)

    def alloc_contiguous_preferred(self, need_size: int) -> Any:
        """The FIFO prefix when contiguous, else the lowest run of whole pages, else FIFO."""
        if self.exact is not None:
            return self.exact.alloc_contiguous_preferred(need_size)
        k = self._pages_for(need_size)
        if k > self._live:
            return None
        if k <= 1:
            end, skipped = self._window(k)
            return self._take(end, skipped, k)
        end, skipped, pages = self._prefix(k)
        if pages is not None and is_run(pages):
            return self._take(end, skipped, k, pages)
        if self._nofit is None or k < self._nofit:
            if self._synced < self._head:
                self._sync()
            free = self._free
            first = int(free.argmax())  # synced, and k <= live: the lowest free page
            if np.count_nonzero(free[first : first + k]) == k:  # it starts a run: first fit
                return self._take_run(first, k)
            start = first_fit(free, k)
            if start >= 0:
                return self._take_run(start, k)
            self._nofit = k
        if not end:
            end, skipped = self._window(k)
        return self._take(end, skipped, k, pages)

    def free(self, slots: Any) -> int:
        """Append ``slots`` (whole aligned pages, none of them free) to the free list."""
        if self.exact is not None:
            return self.exact.free(slots)
        known = self._known(slots)
        if known is not None:  # a selection handed out, unchanged: its pages are known
            pages, run, rows = known
            n = pages.shape[0] * self.page_size
            if not n:
                return 0
            if rows is not None and self._synced <= rows[0]:
                self._give_back_unsynced(pages, run, rows)
                return n
            problem = self._give_back(pages, run, True)
        else:
            torch = self._torch
            values = as_numpy(slots if slots.dtype == torch.int64 else slots.to(torch.int64))
            if values.ndim != 1:
                return self._free_exactly(slots, "freed slots are not a 1-D tensor")
            n = values.shape[0]
            if not n:
                return 0
            checked = self._checker.check(values)
            if checked is None:
                return self._free_exactly(slots, "freed slots are not whole aligned pages")
            problem = self._give_back(*checked, False)
        if problem:
            return self._free_exactly(slots, problem)
        return n

    # -- internals --------------------------------------------------------------------------
    def _known(self, slots: Any) -> tuple[np.ndarray, bool, tuple[int, int] | None] | None:
        """``(pages, run, rows)`` of a selection handed out and unchanged since; else None.

        ``rows``: the queue rows FIFO took them from (tombstones aside), when those rows are
        still in the queue; whether their bits are still set is up to the caller.
        """
        view = self._last_view
        if view is not None and view[0] is slots:  # the last view handed out
            self._last_view = None
            version = version_of(slots)
            if version is None:  # an inference tensor: nothing to rely on
                return None
            if view[3]:
                if version != self._runs.known.version:
                    return None
                return self._ramp[view[1] : view[2]], True, None
            return (
                self._adopted_rows(view[1], view[2]) if version == self._adopted.version else None
            )
        known = self._receipts.claim(slots)
        if known is not None:
            if known[2] is None:
                return known
            queue, first, end = known[2]
            return known[0], known[1], (first, end) if queue is self._pages_q else None
        try:
            address = slots.data_ptr()
        except (AttributeError, RuntimeError):  # not a strided tensor: read it (and fail) in full
            return None
        table, adopted = self._runs.known, self._adopted
        if table.lo <= address < table.hi:
            span = table.span(slots, address)
            return None if span is None else (self._ramp[span[0] : span[1]], True, None)
        if adopted.lo <= address < adopted.hi:
            span = adopted.span(slots, address)
            return None if span is None else self._adopted_rows(*span)
        return None

    def _adopted_rows(self, first: int, end: int) -> tuple[np.ndarray, bool, Any]:
        """``_known``'s answer for rows ``first .. end`` of the adopted slots."""
        pages = self._adopted_pages[first:end]
        first, end = first + self._store_row0, end + self._store_row0  # rows in the queue now
        # they are FIFO's when FIFO has passed them without stepping over a tombstone since
        # the last sync (a view found by address may be the caller's own)
        fifo = self._store_rows and not self._skipped and end <= self._head
        return pages, is_run(pages), (first, end) if fifo else None

    def _pages_for(self, need_size: int) -> int:
        need, ps = int(need_size), self.page_size
        if need % ps:
            raise ValueError(f"need_size {need} is not a multiple of page_size {ps}")
        if need < 0:
            raise ValueError(f"need_size must be >= 0, got {need}")
        return need // ps

    def _give_back(self, pages: np.ndarray, run: bool, distinct: bool) -> str | None:
        """Mark ``pages`` free and queue them; why not (nothing changed in the queue), or None.

        ``distinct``: the pages are known to be distinct (they came from one selection).
        """
        k = pages.shape[0]
        if self._synced < self._head:
            self._sync()
        if run:  # one slice of the bitmap; a run cannot hold a page twice
            lo = pages.item(0)
            if lo + k > self._free.shape[0]:
                self._grow_pages(lo + k)
            bits = self._free[lo : lo + k]
            if np.count_nonzero(bits):
                return "a freed page is already free"
            bits[:] = True
        else:
            try:
                taken = self._free[pages]
            except IndexError:  # a page beyond the bitmap
                self._grow_pages(int(pages.max()) + 1)
                taken = self._free[pages]
            if np.count_nonzero(taken):
                return "a freed page is already free"
            self._free[pages] = True
            if not distinct and int(np.count_nonzero(self._free)) != self._live + k:
                return "freed slots hold a page twice"
        self._append(pages, run)
        return None

    def _give_back_unsynced(self, pages: np.ndarray, run: bool, rows: tuple[int, int]) -> None:
        """Queue FIFO's ``pages`` from queue ``rows`` that no sync has reached yet: the bitmap
        still calls them free, as it must after this free; sync around them."""
        if self._synced < rows[0]:
            self._sync(rows[0])
        self._synced = rows[1]
        self._append(pages, run)

    def _free_exactly(self, slots: Any, reason: str) -> int:
        self._fall_back(self.free_slots, reason)
        return self.exact.free(slots)
