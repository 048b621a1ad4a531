"""The host allocator's selection rule restated over Python lists (an independent model)."""

from __future__ import annotations


def brute_force(
    free: list[int], n: int, ps: int, contiguous: bool
) -> tuple[list[int] | None, list[int]]:
    """Seed 003's selection rule, restated plainly over Python lists.

    FIFO takes the first n slots. Contiguous-preferred keeps that prefix when it is a run
    of consecutive slots; else, among the page-sized chunks of the free list whose slots
    are consecutive, ordered by their first slot, it takes the first window of n/ps chunks
    whose first slots step by ps; else FIFO.
    """
    if n > len(free):
        return None, free
    fifo = (free[:n], free[n:])
    if not contiguous or n == 0 or free[:n] == list(range(free[0], free[0] + n)):
        return fifo
    chunks = [free[i * ps : (i + 1) * ps] for i in range(len(free) // ps)]
    intact = sorted((c[0], i) for i, c in enumerate(chunks) if c == list(range(c[0], c[0] + ps)))
    need = n // ps
    for j in range(len(intact) - need + 1):
        window = intact[j : j + need]
        if all(window[t + 1][0] - window[t][0] == ps for t in range(need - 1)):
            picked = {i for _, i in window}
            selected = [s for _, i in window for s in chunks[i]]
            rest = [
                s
                for pos, s in enumerate(free)
                if pos // ps not in picked or pos >= len(chunks) * ps
            ]
            return selected, rest
    return fifo
