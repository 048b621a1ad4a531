"""The page index behind the fast host allocator: a queue of free pages with tombstones.

* the free list is a queue of *page* rows (``_pages_q[head:tail]``); a page taken from the
  middle by a contiguous selection leaves a tombstone (``_dead``) that FIFO skips later;
* ``_free`` is a bitmap of free pages, ``_row`` the queue row of each free page;
* FIFO only moves ``head``; the bitmap catches up (``_sync``) before the next search or free;
* tombstones are compacted away when they outnumber the free pages (amortized O(1) a page).

Rows before ``head`` are never written again (compaction moves the live rows to a new
array), so a view of them stays valid: receipts keep such views as the pages of a selection.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cpkv.alloc.host.fast.handouts import Receipts, RunSlots
from cpkv.alloc.host.fast.pages import expand, is_run, ramp, slot_table


class PageQueue:
    """Queue, tombstones and bitmap of free pages; selections come out as torch tensors."""

    min_rows = 1024  # queue capacity floor; tombstones are compacted above max(live, min_rows)
    page_size: int
    _torch: Any

    def _index(self, pages: np.ndarray) -> str | None:
        """Build the index of the free pages ``pages`` (in free-list order); a problem or None."""
        n = pages.shape[0]
        size = int(pages.max()) + 1 if n else 0
        self._runs = RunSlots(self._torch, self.page_size, size)  # 17.6 MB at 220 GB
        self._pages_q = np.empty(max(self.min_rows, 2 * n), dtype=np.int64)
        self._pages_q[:n] = pages
        self._dead = np.zeros(self._pages_q.shape[0], dtype=bool)
        self._free = np.zeros(size, dtype=bool)
        self._free[pages] = True
        if int(np.count_nonzero(self._free)) != n:
            return "the free list holds a page twice"
        self._row = np.empty(size, dtype=np.int64)
        self._row[pages] = np.arange(n, dtype=np.int64)
        self._table = slot_table(self.page_size, size)
        self._ramp = ramp(max(size, self._pages_q.shape[0]))
        self._head = self._synced = self._ndead = 0
        self._tail = self._live = n
        self._skipped = False
        self._nofit: int | None = None
        self._receipts = Receipts()
        # the last view handed out, as (view, first, end, in_table): the rows of the adopted
        # slots or the pages of the slot table it shows (held, so its id stays its own)
        self._last_view: tuple[Any, int, int, bool] | None = None
        self._store: Any = None  # the view of the adopted slots FIFO slices from; set last
        self._store_row0, self._store_rows = 0, 0
        return None

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
        if pages is None:
            pages = self._pages_q[head:end]
            if skipped:
                pages = pages[~self._dead[head:end]]
        row0 = self._store_row0
        if not skipped and head >= row0 and end <= row0 + self._store_rows:
            out = self._store[(head - row0) * ps : (end - row0) * ps]
            self._last_view = (out, head - row0, end - row0, False)
            return out
        if k and is_run(pages):
            first = pages.item(0)
            out, lent = self._runs.take(first, k)
            if lent:
                self._last_view = (out, first, first + k, True)
            else:
                self._receipts.note(out, pages, True, (self._pages_q, head, end))
            return out
        out = self._torch.from_numpy(expand(pages, ps, self._table))
        self._receipts.note(out, pages, False, (self._pages_q, head, end))
        return out

    def _take_run(self, start: int, k: int) -> Any:
        """Take the free pages ``start .. start + k - 1`` out of the middle of the queue."""
        stop = start + k
        self._dead[self._row[start:stop]] = True
        self._free[start:stop] = False
        self._ndead += k
        self._live -= k
        if self._ndead > max(self._live, self.min_rows):
            self._compact()
        out, lent = self._runs.take(start, k)
        if lent:
            self._last_view = (out, start, stop, True)
        else:
            self._receipts.note(out, self._ramp[start:stop], True)
        return out

    def _sync(self, upto: int | None = None) -> None:
        """Clear the bitmap bits of the pages FIFO took since the last sync (up to row ``upto``)."""
        lo, hi = self._synced, self._head if upto is None else upto
        if lo < hi:
            pages = self._pages_q[lo:hi]
            if self._skipped:  # FIFO stepped over tombstones: their pages are not FIFO's
                pages = pages[~self._dead[lo:hi]]
            self._free[pages] = False
            self._synced = hi
        if hi == self._head:
            self._skipped = False

    def _live_pages(self) -> np.ndarray:
        pages = self._pages_q[self._head : self._tail]
        return pages[~self._dead[self._head : self._tail]] if self._ndead else pages

    def _append(self, pages: np.ndarray, run: bool) -> None:
        """Put ``pages`` (now marked free in the bitmap) at the tail of the queue."""
        k = pages.shape[0]
        if self._tail + k > self._pages_q.shape[0]:
            self._compact(extra=k)
        tail = self._tail
        self._pages_q[tail : tail + k] = pages
        rows = self._ramp[tail : tail + k]
        if run:
            lo = pages.item(0)
            self._row[lo : lo + k] = rows
        else:
            self._row[pages] = rows
        self._tail = tail + k
        self._live += k
        self._nofit = None

    def _compact(self, extra: int = 0) -> None:
        """Drop consumed rows and tombstones; keep room for ``extra`` more rows."""
        self._sync()
        head, live = self._head, self._live_pages()
        n = live.shape[0]
        queue = np.empty(max(self.min_rows, 2 * (n + extra)), dtype=np.int64)
        queue[:n] = live
        if queue.shape[0] > self._ramp.shape[0]:
            self._ramp = ramp(queue.shape[0])
        self._row[live] = self._ramp[:n]
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
        if size > self._ramp.shape[0]:
            self._ramp = ramp(size)
