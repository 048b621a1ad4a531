"""First fit over a free-page bitmap: the lowest page that starts a run of ``k`` free pages.

This is the search at the heart of seed 003's contiguous-preferred rule once the free list
is known to be made of whole aligned pages: the chunks of the free list are then exactly
the free pages, sorted by address they are the set bits of a bitmap, and "the first ``k``
sorted starts that each step by one page" is the lowest run of ``k`` set bits.

Two steps, both without a Python loop over pages:

* fast path: the first free page (``argmax`` stops at the first set byte) starts a run,
  checked by one ``k``-byte ``all``;
* otherwise an *erosion* on a Python integer holding a window of the bitmap (all of it is
  4.3 KB at 220 GB; windows start small and grow, so a near fit costs little):
  ``E(2m) = E(m) & (E(m) << m)`` keeps the bits that start a run of ``2m``; a last
  overlapping step reaches any ``k``. That is about ``2 log2 k`` big-integer operations over
  the whole bitmap (each a C loop over 30-bit digits) and the answer is the highest set bit,
  because the bitmap is packed most-significant-first (page 0 is the top bit).
"""

from __future__ import annotations

import numpy as np

WINDOW_PAGES = 2048  # the first erosion window (pages); later windows are 4x larger


def first_fit(free: np.ndarray, k: int, window: int = WINDOW_PAGES) -> int:
    """Lowest ``p`` with ``free[p:p + k]`` all True (``free`` a bool array); -1 when none.

    ``window`` is the size of the first erosion window in pages (at least ``2 k``).
    """
    size = free.shape[0]
    if k <= 0:
        return 0
    if k > size:
        return -1
    first = int(free.argmax())
    if not free[first]:
        return -1
    if k == 1:
        return first
    if first + k > size:
        return -1
    if np.count_nonzero(free[first : first + k]) == k:  # count_nonzero: cheaper than all()
        return first
    lo, width = first, max(window, 2 * k)
    while True:  # windows that grow 4x and overlap by k - 1 pages: a near fit is found early
        hi = min(size, lo + width)
        offset = run_start(free[lo:hi], k)
        if offset >= 0:
            return lo + offset
        if hi == size:
            return -1
        lo, width = hi - (k - 1), width * 4


def run_start(free: np.ndarray, k: int) -> int:
    """Offset of the lowest run of ``k`` True values in ``free``; -1 when none (erosion)."""
    nbits = 8 * ((free.shape[0] + 7) // 8)
    eroded = int.from_bytes(np.packbits(free).tobytes(), "big")  # free[0] is bit nbits - 1
    width = 1
    while width * 2 <= k:
        eroded &= eroded << width
        width *= 2
        if not eroded:
            return -1
    if width < k:
        eroded &= eroded << (k - width)
    if not eroded:
        return -1
    return nbits - eroded.bit_length()
