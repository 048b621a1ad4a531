"""Free-page layouts and per-page compute-owner patterns for the CP shared paged L1 allocator.

Both reproduce seed 003 (`--bench l1`) exactly: for the same arguments and seed they give the
same page order and the same owners.  Logical pages are numbered from 1; page ``p`` belongs to
owner lane ``(p - 1) % cp_size`` and sits at (0-based) physical ordinal ``(p - 1) // cp_size``
of that lane.

Free patterns (a flat free list over all ``physical_pages * cp_size`` logical pages):

* ``sequential``: ``1, 2, ..., L``.
* ``random``: ``torch.randperm(L)`` drawn from a CPU generator seeded with ``seed``, plus 1.
* ``owner_fragmented_later_run``: for every owner that the request uses (ascending owner), a
  fragmented front of ``count`` of its pages taken from its highest ordinal downwards in
  steps of 2, and a later run of ``count`` physically consecutive pages starting at ordinal
  ``min(max(4, 3 * count), max(0, physical_pages - count))``; the list is all fronts (owner
  order), then all runs (owner order), then every other page in ascending order.

Owner patterns (one compute owner per requested page):

* ``round_robin``: ``0, 1, ..., cp_size - 1, 0, 1, ...``.
* ``single_owner``: all 0.
* ``zigzag``: ``2 * cp_size`` segments as equal as possible (the first ``n % (2 * cp_size)``
  one page longer); segment ``s`` belongs to owner ``s`` for ``s < cp_size``, else to
  ``2 * cp_size - 1 - s``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FREE_PATTERNS = ("sequential", "owner_fragmented_later_run", "random")
OWNER_PATTERNS = ("round_robin", "single_owner", "zigzag")


def zigzag_owners(num_pages: int, cp_size: int) -> list[int]:
    """The zigzag owner of each of ``num_pages`` pages (CP load balancing: 0..cp-1, cp-1..0)."""
    segments = 2 * cp_size
    base, longer = divmod(num_pages, segments)
    owners: list[int] = []
    for segment in range(segments):
        owner = segment if segment < cp_size else segments - 1 - segment
        owners += [owner] * (base + (1 if segment < longer else 0))
    return owners


def make_page_owners(pattern: str, request_pages: int, cp_size: int) -> list[int]:
    """The compute owner of each requested page under owner ``pattern``."""
    if pattern == "round_robin":
        return [page % cp_size for page in range(request_pages)]
    if pattern == "single_owner":
        return [0] * request_pages
    if pattern == "zigzag":
        return zigzag_owners(request_pages, cp_size)
    raise ValueError(f"unknown owner pattern {pattern!r}; allowed: {', '.join(OWNER_PATTERNS)}")


def _fragmented_later_run(
    physical_pages: int, cp_size: int, request_owners: list[int]
) -> list[int]:
    logical_pages = physical_pages * cp_size
    counts = [0] * cp_size
    for owner in request_owners:
        counts[owner] += 1
    taken: set[int] = set()
    fronts: list[int] = []
    runs: list[int] = []
    for owner, count in enumerate(counts):
        if count == 0:
            continue
        start = min(max(4, 3 * count), max(0, physical_pages - count))
        run = [owner + 1 + cp_size * (start + i) for i in range(count)]
        if run[-1] > logical_pages:  # the lane is too short for a run of this length
            run = []
        taken.update(run)
        runs += run
        added = 0
        for ordinal in range(physical_pages - 1, -1, -2):
            if added == count:
                break
            page = owner + 1 + cp_size * ordinal
            if page not in taken:
                fronts.append(page)
                taken.add(page)
                added += 1
    rest = [page for page in range(1, logical_pages + 1) if page not in taken]
    return fronts + runs + rest


def make_free_pages(
    pattern: str,
    *,
    physical_pages: int,
    cp_size: int,
    request_owners: list[int],
    seed: int,
) -> torch.Tensor:
    """The flat free list (int64 CPU tensor of logical pages) laid out by free ``pattern``."""
    import torch

    logical_pages = physical_pages * cp_size
    if pattern == "sequential":
        return torch.arange(1, logical_pages + 1, dtype=torch.int64)
    if pattern == "random":
        generator = torch.Generator(device="cpu")
        generator.manual_seed(seed)
        return torch.randperm(logical_pages, generator=generator, dtype=torch.int64) + 1
    if pattern == "owner_fragmented_later_run":
        pages = _fragmented_later_run(physical_pages, cp_size, request_owners)
        return torch.tensor(pages, dtype=torch.int64)
    raise ValueError(f"unknown free pattern {pattern!r}; allowed: {', '.join(FREE_PATTERNS)}")
