"""Token slots <-> whole aligned pages, for the fast host allocator (numpy, no torch).

A run of ``page_size`` token slots is a *whole aligned page* ``p`` when it is exactly
``p * page_size + 0 .. page_size - 1``. The fast allocator keeps pages, not slots, so it
checks this on every slot tensor it adopts or is given back (:class:`PageCheck`), and it
turns page ids back into slots for its selections (:func:`expand`).

:func:`expand` copies rows of a read-only table whose row ``p`` is page ``p``'s slots (a
row gather runs at memcpy speed, twice as fast as computing ``p * ps + arange(ps)`` with
numpy broadcasting). The table is a cache of ``arange`` per page size, shared by every
allocator of the process and only ever extended; it holds no allocator state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCK_SLOTS = 1 << 15  # checked per block of 256 KB of slots, with a 32 KB scratch


class PageCheck:
    """Checks slot arrays for whole aligned pages with a reusable scratch buffer."""

    def __init__(self, page_size: int) -> None:
        self.page_size = ps = int(page_size)
        self.block = max(ps, BLOCK_SLOTS - BLOCK_SLOTS % ps)
        self._scratch = np.zeros(self.block, dtype=bool)  # touched now, not in a timed call
        power_of_two = ps & (ps - 1) == 0
        self._shift = ps.bit_length() - 1
        self._bad_bits = np.int64(np.iinfo(np.int64).min | (ps - 1)) if power_of_two else None

    def pages(self, slots: np.ndarray) -> np.ndarray | None:
        """Page ids of ``slots`` (1-D int64) in order, or None if not whole aligned pages."""
        checked = self.check(slots)
        return None if checked is None else checked[0]

    def check(self, slots: np.ndarray) -> tuple[np.ndarray, bool] | None:
        """``(page ids, whether they are a run of consecutive pages)``, or None as above."""
        ps = self.page_size
        n = slots.shape[0]
        if n % ps:
            return None
        if n == 0:
            return np.empty(0, dtype=np.int64), True
        first = slots.item(0)
        if first >= 0 and first % ps == 0 and slots.item(n - 1) - first == n - 1:
            # maybe one run (what a contiguous selection gives back): strictly increasing
            # slots whose last is the first + n - 1 are exactly first .. first + n - 1
            if self._rising(slots, across_pages=True):
                page = first // ps
                return ramp(page + n // ps)[page:], True
        # Whole pages: inside every page the slots strictly increase (one sequential pass
        # into a reused bool scratch, first, while the slots stream in) and each page spans
        # ps - 1; strictly increasing integers that span ps - 1 are exactly first .. first+ps-1.
        if ps > 1 and not self._rising(slots, across_pages=False):
            return None
        firsts = slots[::ps]
        if self._bad_bits is not None:  # page_size 2**s: no sign bit, no low bits, in one test
            if np.count_nonzero(firsts & self._bad_bits):
                return None
            pages = firsts >> self._shift
        else:
            if int(firsts.min()) < 0 or np.count_nonzero(firsts % ps):
                return None
            pages = firsts // ps
        if ps > 1 and np.count_nonzero(slots[ps - 1 :: ps] - firsts != ps - 1):
            return None
        return pages, is_run(pages)

    def _rising(self, slots: np.ndarray, across_pages: bool) -> bool:
        """Each slot exceeds the one before it (within pages only, unless ``across_pages``)."""
        ps, n = self.page_size, slots.shape[0]
        for lo in range(0, n, self.block):
            if across_pages and lo and slots.item(lo) <= slots.item(lo - 1):
                return False  # the pair across two check blocks
            seg = slots[lo : min(n, lo + self.block)]
            rising = np.greater(seg[1:], seg[:-1], out=self._scratch[: seg.shape[0] - 1])
            if not across_pages:
                rising[ps - 1 :: ps] = True  # page boundaries: anything goes
            if np.count_nonzero(rising) != rising.shape[0]:
                return False
        return True


_TABLES: dict[int, np.ndarray] = {}


def slot_table(page_size: int, pages: int) -> np.ndarray:
    """A read-only ``(>= pages, page_size)`` array whose row ``p`` holds page ``p``'s slots."""
    table = _TABLES.get(page_size)
    if table is None or table.shape[0] < pages:
        rows = max(pages, 2 * table.shape[0] if table is not None else pages)
        table = np.arange(rows * page_size, dtype=np.int64).reshape(rows, page_size)
        table.flags.writeable = False
        _TABLES[page_size] = table
    return table


def ramp(stop: int) -> np.ndarray:
    """The read-only array ``0 .. stop - 1`` (a view of the cached table for page size 1)."""
    return slot_table(1, stop).reshape(-1)[:stop]


def expand(pages: np.ndarray, page_size: int, table: np.ndarray | None = None) -> np.ndarray:
    """The token slots of ``pages``, page after page (a new int64 array).

    ``table`` is :func:`slot_table`'s array when the caller knows it covers ``pages``.
    """
    k = pages.shape[0]
    if k and is_run(pages):
        first = int(pages[0]) * page_size
        return np.arange(first, first + k * page_size, dtype=np.int64)
    if table is None:
        table = slot_table(page_size, int(pages.max()) + 1 if k else 0)
    return np.take(table, pages, axis=0).reshape(-1)


def is_run(pages: np.ndarray) -> bool:
    """``pages`` are consecutive ascending page ids (O(1) reject, O(k) confirm)."""
    k = pages.shape[0]
    if k <= 1:
        return True
    first = pages.item(0)
    if pages.item(k - 1) - first != k - 1:
        return False
    return k == 2 or not np.count_nonzero(pages != ramp(first + k)[first:])


def as_numpy(values: Any) -> np.ndarray:
    """The numpy view of a CPU tensor (a copy for a tensor on another device)."""
    try:
        return values.numpy()
    except (TypeError, RuntimeError):  # another device, or a tensor that requires grad
        return values.detach().cpu().numpy()
