"""Fast host (L2) KV allocator (impl ``fast``): the reference's answers without its rescans.

Same selections (same slots, same order), same ``None``/``ValueError`` outcomes and the same
logical free list as :class:`cpkv.alloc.host.HostAllocator` after every call. The reference
spends ~99% of a contiguous-preferred call on passes over every free slot
(shared/reference/allocator_perf.md §3.1); this keeps an incremental page index (design "D"):

* the free list is a queue of *page* rows (``_pages_q[head:tail]``); a page taken from the
  middle by a contiguous selection leaves a tombstone (``_dead``) that FIFO skips later;
* ``_free`` is a bitmap of free pages, ``_row`` the queue row of each free page;
* FIFO selections from the caller's adopted slots are views of it, as in the reference; FIFO
  only moves ``head``, and the bitmap catches up (``_sync``) before the next search or free;
* the search is :func:`cpkv.alloc.host_firstfit.first_fit`; once no run of ``k`` pages
  exists, none of ``k`` or more does until the next free (``_nofit``);
* tombstones are compacted away when they outnumber the free pages (amortized O(1) a page).

Invariant: the free list is made of whole aligned pages (slots ``p*ps .. p*ps+ps-1``), each
page at most once. Allocations keep it; construction and every ``free`` check it. When a
free list or a freed tensor breaks it (partial or unaligned pages, a page freed twice,
another dtype), ``fallback_reason`` says why and the exact logical free list goes to the
reference algorithm, which answers every later call: same results, only slower.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cpkv.alloc.host_firstfit import first_fit
from cpkv.alloc.host_pages import PageCheck, as_numpy, expand, is_run, ramp, slot_table


class FastHostAllocator:
    """Impl ``fast``: an incremental page index over the reference's free list (numpy, CPU)."""

    name = "fast"
    min_rows = 1024  # queue capacity floor; tombstones are compacted above max(live, min_rows)

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
        if problem:
            self._fall_back(free_slots, problem)
            return
        n = pages.shape[0]
        self._pages_q = np.empty(max(self.min_rows, 2 * n), dtype=np.int64)
        self._pages_q[:n] = pages
        self._dead = np.zeros(self._pages_q.shape[0], dtype=bool)
        size = int(pages.max()) + 1 if n else 0
        self._free = np.zeros(size, dtype=bool)
        self._free[pages] = True
        if int(np.count_nonzero(self._free)) != n:
            self._fall_back(free_slots, "the free list holds a page twice")
            return
        self._row = np.empty(size, dtype=np.int64)
        self._row[pages] = np.arange(n, dtype=np.int64)
        self._table = slot_table(self.page_size, size)
        ramp(max(size, self._pages_q.shape[0]))  # built now, not in a timed call
        self._head = self._synced = self._ndead = 0
        self._tail = self._live = n
        self._skipped = False
        self._nofit: int | None = None
        # Last: the view FIFO selections are sliced from (the caller's slots, not copied). The
        # reference's construction is the clone itself; ending on a torch view leaves torch's
        # slicing path as warm as that for the cold protocol's first call.
        self._store, self._store_row0, self._store_rows = free_slots[: n * self.page_size], 0, n

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
        from cpkv.alloc.host import HostAllocator

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
                return self._store[(head - row0) * ps : (end - row0) * ps]
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
            start = first_fit(self._free, k)
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
        torch = self._torch
        values = as_numpy(slots if slots.dtype == torch.int64 else slots.to(torch.int64))
        if values.ndim != 1:
            return self._free_exactly(slots, "freed slots are not a 1-D tensor")
        n = values.shape[0]
        if n == 0:
            return 0
        checked = self._checker.check(values)
        if checked is None:
            return self._free_exactly(slots, "freed slots are not whole aligned pages")
        pages, run = checked
        k = pages.shape[0]
        if self._synced < self._head:
            self._sync()
        if run:  # one slice of the bitmap; a run cannot hold a page twice
            lo = int(pages[0])
            if lo + k > self._free.shape[0]:
                self._grow_pages(lo + k)
            bits = self._free[lo : lo + k]
            if np.count_nonzero(bits):
                return self._free_exactly(slots, "a freed page is already free")
            bits[:] = True
        else:
            try:
                taken = self._free[pages]
            except IndexError:  # a page beyond the bitmap
                self._grow_pages(int(pages.max()) + 1)
                taken = self._free[pages]
            if np.count_nonzero(taken):
                return self._free_exactly(slots, "a freed page is already free")
            self._free[pages] = True
            if int(np.count_nonzero(self._free)) != self._live + k:
                return self._free_exactly(slots, "freed slots hold a page twice")
        if self._tail + k > self._pages_q.shape[0]:
            self._compact(extra=k)
        tail = self._tail
        self._pages_q[tail : tail + k] = pages
        rows = ramp(tail + k)[tail:]
        if run:
            self._row[lo : lo + k] = rows
        else:
            self._row[pages] = rows
        self._tail = tail + k
        self._live += k
        self._nofit = None
        return int(n)

    # -- internals --------------------------------------------------------------------------
    def _pages_for(self, need_size: int) -> int:
        need, ps = int(need_size), self.page_size
        if need % ps:
            raise ValueError(f"need_size {need} is not a multiple of page_size {ps}")
        if need < 0:
            raise ValueError(f"need_size must be >= 0, got {need}")
        return need // ps

    def _prefix(self, k: int) -> tuple[int, int, Any]:
        """``(end, skipped, pages)`` of the first ``k >= 2`` live rows when they may be a run.

        O(1) rejects first: the first two rows (when live) are not consecutive pages, or the
        first and the last live page are not ``k - 1`` apart; then ``(0, 0, None)``.
        """
        head, queue, dead = self._head, self._pages_q, self._dead
        if not (self._ndead and (dead.item(head) or dead.item(head + 1))):
            if queue.item(head + 1) != queue.item(head) + 1:
                return 0, 0, None
        end, skipped = self._window(k)
        first = head + int(dead[head:end].argmin()) if skipped else head
        if queue.item(end - 1) - queue.item(first) != k - 1:
            return end, skipped, None
        return end, skipped, queue[head:end][~dead[head:end]] if skipped else queue[head:end]

    def _window(self, k: int) -> tuple[int, int]:
        """End row of the first ``k`` live rows from ``head``, and the tombstones among them."""
        head, dead = self._head, self._dead
        end = head + k
        if not self._ndead:
            return end, 0
        missing = int(np.count_nonzero(dead[head:end]))
        for _ in range(4):  # extend by the rows still missing (usually once or twice)
            if not missing:
                return end, end - head - k
            end, missing = end + missing, int(np.count_nonzero(dead[end : end + missing]))
        span = 64
        while missing:  # a long stretch of tombstones: look ahead in growing spans
            span = max(span * 2, 2 * missing)
            live = ~dead[end : min(end + span, self._tail)]
            found = int(np.count_nonzero(live))
            if found >= missing:
                end += int(np.flatnonzero(live)[missing - 1]) + 1
                break
            missing -= found
            end += live.shape[0]
        return end, end - head - k

    def _take(self, end: int, skipped: int, k: int, pages: Any = None) -> Any:
        """Take the first ``k`` live rows (``head .. end``) as a FIFO selection."""
        head, ps = self._head, self.page_size
        self._head = end
        if skipped:
            self._ndead -= skipped
            self._skipped = True
        self._live -= k
        row0 = self._store_row0
        if not skipped and head >= row0 and end <= row0 + self._store_rows:
            return self._store[(head - row0) * ps : (end - row0) * ps]
        if pages is None:
            pages = self._pages_q[head:end]
            if skipped:
                pages = pages[~self._dead[head:end]]
        return self._torch.from_numpy(expand(pages, ps, self._table))

    def _take_run(self, start: int, k: int) -> Any:
        """Take the free pages ``start .. start + k - 1`` out of the middle of the queue."""
        stop = start + k
        self._dead[self._row[start:stop]] = True
        self._free[start:stop] = False
        self._ndead += k
        self._live -= k
        if self._ndead > max(self._live, self.min_rows):
            self._compact()
        ps = self.page_size
        return self._torch.from_numpy(np.arange(start * ps, stop * ps, dtype=np.int64))

    def _sync(self) -> None:
        """Clear the bitmap bits of the pages FIFO took since the last sync."""
        lo, hi = self._synced, self._head
        if lo < hi:
            pages = self._pages_q[lo:hi]
            if self._skipped:  # FIFO stepped over tombstones: their pages are not FIFO's
                pages = pages[~self._dead[lo:hi]]
            self._free[pages] = False
            self._synced, self._skipped = hi, False

    def _live_pages(self) -> np.ndarray:
        pages = self._pages_q[self._head : self._tail]
        return pages[~self._dead[self._head : self._tail]] if self._ndead else pages

    def _compact(self, extra: int = 0) -> None:
        """Drop consumed rows and tombstones; keep room for ``extra`` more rows."""
        self._sync()
        head, live = self._head, self._live_pages()
        n = live.shape[0]
        queue = np.empty(max(self.min_rows, 2 * (n + extra)), dtype=np.int64)
        queue[:n] = live
        ramp(queue.shape[0])
        self._row[live] = np.arange(n, dtype=np.int64)
        if self._ndead:
            self._store_rows = 0  # rows moved: FIFO selections are built from pages from now on
        else:
            self._store_row0 -= head
        self._pages_q, self._dead = queue, np.zeros(queue.shape[0], dtype=bool)
        self._head = self._synced = self._ndead = 0
        self._tail = n

    def _grow_pages(self, size: int) -> None:
        size = max(size, 2 * self._free.shape[0])
        free = np.zeros(size, dtype=bool)
        free[: self._free.shape[0]] = self._free
        row = np.empty(size, dtype=np.int64)
        row[: self._row.shape[0]] = self._row
        self._free, self._row = free, row
        self._table = slot_table(self.page_size, size)

    def _free_exactly(self, slots: Any, reason: str) -> int:
        self._fall_back(self.free_slots, reason)
        return self.exact.free(slots)
