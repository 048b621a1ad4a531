"""What the fast host allocator hands out, and how it recognises it when it comes back.

Three kinds of selections, and how ``free`` learns their pages without reading their slots:

* FIFO selections are views of the caller's adopted slots, as in the reference.
  Construction read and checked all of them and noted their tensor's version counter.
* The first selection of a page run is a view of the allocator's own slot table
  (:class:`RunSlots`): an ``arange`` of every slot of the pool, 8 bytes per slot (17.6 MB at
  220 GB, the size of one copy of the reference's free list), built at construction. Each
  page is lent at most once, so two selections never share memory, and a caller that writes
  into one (by any means) only changes slots that are never lent again.
* Other selections are new tensors, copied from :func:`cpkv.alloc.host.fast.pages.slot_table`
  (which is never handed out). :class:`Receipts` remembers each (a weak reference and its
  pages): freeing that very tensor object, unchanged, reads nothing.

A freed tensor whose data lies in the adopted slots or in the slot table (a view of either,
found by its address: :class:`KnownSlots`) shows exactly the slots construction saw there,
as long as that tensor's version counter has not moved: its pages follow from its address
and length. (The allocator also keeps the last view it handed out, so that freeing that
very tensor needs one torch call, not five.) Torch bumps the version counter, shared by a tensor and all its views, on every
in-place write made through torch (values, ``resize_``, ``as_strided_``, ``set_``, ``out=``,
...); a write through a lent view also stops lending from that table (``as_strided`` can
reach past the view). Anything else (a clone, a tensor written in place, pieces of pages) is
read and checked in full. The one assumption: nobody writes into a selection *behind
torch's back* (through ``.numpy()``, ``.data``, ``untyped_storage()`` or a raw pointer) and
then frees it; autograd relies on the same counter. Tensors made under
``torch.inference_mode()`` carry no version counter: freeing one of them reads it in full.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from cpkv.alloc.host.fast.pages import slot_table

PURGE_AT = 4096  # receipts of tensors that died unfreed are dropped when this many pile up


def version_of(tensor: Any) -> int | None:
    """``tensor._version``, or None for an inference tensor (no version counter)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


class KnownSlots:
    """Slots laid out page after page in one contiguous tensor that construction checked.

    A 1-D view of it (any tensor whose data lies in its memory) shows the slots construction
    saw, as long as the tensor's version counter has not moved: its pages follow from its
    address and length, with no need to read it.
    """

    def __init__(self, tensor: Any, page_size: int, pages: int) -> None:
        self.tensor, self.page_size, self.pages = tensor, page_size, pages
        version = version_of(tensor)
        self.version = version if tensor.is_contiguous() else None  # None: nothing is known
        self._dtype = tensor.dtype
        self.lo = tensor.data_ptr()
        self.hi = self.lo + 8 * page_size * pages if self.version is not None else self.lo

    def span(self, view: Any, address: int) -> tuple[int, int] | None:
        """``(first, end)`` pages that ``view`` (at ``address``, in ``lo .. hi``) shows; or None."""
        if self.tensor._version != self.version:
            return None
        shape, ps = view.shape, self.page_size
        if len(shape) != 1 or shape[0] % ps or view.dtype is not self._dtype:
            return None
        n = shape[0]
        if n > 1 and view.stride()[0] != 1:
            return None
        offset, page_bytes = address - self.lo, 8 * ps
        if offset % page_bytes:
            return None
        first = offset // page_bytes
        end = first + n // ps
        return (first, end) if end <= self.pages else None


class RunSlots:
    """Selections of page runs: a view of a per-allocator table the first time, then copies."""

    def __init__(self, torch: Any, page_size: int, pages: int) -> None:
        self.page_size = ps = int(page_size)
        self._torch = torch
        self._pristine = slot_table(ps, pages).reshape(-1)  # shared, read-only, never handed out
        self._lent = np.zeros(pages, dtype=bool)
        self.table = torch.arange(pages * ps, dtype=torch.int64)
        self.known = KnownSlots(self.table, ps, pages)  # lent views are known by address
        self.lending = self.known.version is not None

    def take(self, start: int, k: int) -> tuple[Any, bool]:
        """The slots of pages ``start .. start + k - 1`` as a 1-D int64 tensor; lent or not."""
        ps, stop = self.page_size, start + k
        if self.lending:
            lent = self._lent[start:stop]
            if lent.shape[0] == k and not np.count_nonzero(lent):
                if self.table._version == self.known.version:
                    lent[:] = True
                    return self.table[start * ps : stop * ps], True
                self.lending = False  # written through a view: lend no more from this table
        if stop * ps > self._pristine.shape[0]:
            self._pristine = slot_table(ps, stop).reshape(-1)
        return self._torch.from_numpy(self._pristine[start * ps : stop * ps].copy()), False


class Receipts:
    """New tensors handed out and not yet freed: ``id -> (weakref, version, pages, ...)``."""

    def __init__(self) -> None:
        self._held: dict[int, tuple] = {}
        self._purge_at = PURGE_AT

    def __len__(self) -> int:
        return len(self._held)

    def note(self, tensor: Any, pages: np.ndarray, run: bool, rows: Any = None) -> None:
        """Remember ``tensor``, a tensor just created, as the slots of ``pages`` (read-only).

        ``rows``: ``(queue, first, end)`` when FIFO took the pages from those queue rows. A new
        tensor's version is 0 (an inference tensor has none: it will never be claimed).
        """
        held = self._held
        held[id(tensor)] = (weakref.ref(tensor), 0, pages, run, rows)
        if len(held) >= self._purge_at:
            self._purge()

    def claim(self, tensor: Any) -> tuple[np.ndarray, bool, Any] | None:
        """``(pages, run, rows)`` of a tensor handed out, if ``tensor`` is it, unchanged.

        Claiming forgets the receipt: a second free of the same tensor is read in full.
        """
        entry = self._held.pop(id(tensor), None)
        if entry is None or entry[0]() is not tensor or version_of(tensor) != entry[1]:
            return None
        return entry[2], entry[3], entry[4]

    def _purge(self) -> None:
        self._held = {key: e for key, e in self._held.items() if e[0]() is not None}
        self._purge_at = max(PURGE_AT, 2 * len(self._held))
