"""The host free-list layouts of seed 003, page for page.

``page_order`` returns the order in which free pages sit in the host allocator's free
list. The same (total_pages, request_pages, pattern, seed) gives the same order as the
seed's benchmark, so a cpkv row and a seed row describe the same case.
"""

from __future__ import annotations

from itertools import chain, islice
from typing import Any

from cpkv.alloc.host.schema import HOST_PATTERNS


def page_order(total_pages: int, request_pages: int, pattern: str, seed: int) -> list[int]:
    if total_pages <= 0 or request_pages <= 0 or request_pages > total_pages:
        raise ValueError(
            f"need 0 < request_pages <= total_pages, got {request_pages=} {total_pages=}"
        )
    if pattern == "contiguous_fifo":
        return list(range(total_pages))
    if pattern == "random_fragmented":
        import torch

        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed)
        return torch.randperm(total_pages, generator=gen).tolist()
    if pattern == "fragmented_prefix_later_run":
        return _fragmented_prefix_later_run(total_pages, request_pages)
    if pattern == "no_run":
        return _no_run(total_pages, request_pages, seed)
    raise ValueError(f"unknown host pattern {pattern!r} (allowed: {', '.join(HOST_PATTERNS)})")


def _fragmented_prefix_later_run(total: int, need: int) -> list[int]:
    """Scattered pages first (so FIFO is never contiguous), then one run of ``need`` pages.

    The run starts at about a third of the pool. The scattered prefix takes pages from
    the top of memory going down two at a time (every other page, so no two are
    neighbours), first one parity, then the other, skipping the run.
    """
    start = min(max(1, total // 3), total - need)
    run = range(start, start + need)
    in_run = set(run)
    downward = chain(range(total - 1, -1, -2), range(total - 2, -1, -2))
    scattered = list(islice((p for p in downward if p not in in_run), need))
    used = in_run.union(scattered)
    rest = [p for p in range(total) if p not in used]
    return scattered + list(run) + rest


def _no_run(total: int, need: int, seed: int) -> list[int]:
    """cpkv's worst case: free runs of ``need - 1`` pages, each followed by one used page.

    No run of ``need`` pages exists (for ``need`` >= 2; for 1 page every other page is
    free), yet almost every free page starts a run that nearly qualifies; the free pages
    are listed in a seeded random order, so the FIFO prefix is not contiguous either.
    """
    import torch

    gap = max(need, 2)
    free = [p for p in range(total) if p % gap != gap - 1]
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return [free[i] for i in torch.randperm(len(free), generator=gen).tolist()]


def pages_to_slots(pages: Any, page_size: int) -> Any:
    """Token slots of whole pages, in page order (an int64 torch tensor)."""
    import torch

    ids = torch.as_tensor(pages, dtype=torch.int64)
    return (ids[:, None] * page_size + torch.arange(page_size, dtype=torch.int64)).reshape(-1)


def free_slots(
    total_pages: int, request_pages: int, page_size: int, pattern: str, seed: int
) -> Any:
    return pages_to_slots(page_order(total_pages, request_pages, pattern, seed), page_size)
