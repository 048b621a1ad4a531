"""A brute-force model of the CP shared paged L1 allocator, written from its description
(cpkv.alloc.l1.reference's docstring) with Python lists and sets only: no torch, no numpy,
nothing shared with the implementations.  The L1 tests compare every implementation to it."""

from __future__ import annotations

import math


class Model:
    def __init__(self, physical: int, cp: int, page_size: int, selector: str, order: str, free):
        self.physical, self.cp, self.page_size = physical, cp, page_size
        self.selector = "contiguous" if selector == "current" else selector
        self.order = order
        self.free: list[list[int]] = [[] for _ in range(cp)]
        for page in free:  # lane of page p is (p - 1) % cp
            self.free[(page - 1) % cp].append(page)
        if order == "sorted":
            self.free = [sorted(lane) for lane in self.free]
        self.release: list[list[int]] = [[] for _ in range(cp)]
        self.allocated = set(range(1, physical * cp + 1)) - set(free)

    # -- helpers --------------------------------------------------------------------------
    def ordinal(self, page: int) -> int:
        return (page - 1) // self.cp

    def consecutive(self, pages: list[int]) -> bool:
        return all(
            self.ordinal(b) == self.ordinal(a) + 1 for a, b in zip(pages, pages[1:], strict=False)
        )

    def required(self, owners) -> list[int]:
        need = [0] * self.cp
        for owner in owners:
            if not 0 <= owner < self.cp:
                raise ValueError(owner)
            need[owner] += 1
        return need

    def available(self) -> list[int]:
        return [len(f) + len(r) for f, r in zip(self.free, self.release, strict=True)]

    # -- operations -----------------------------------------------------------------------
    def stats(self, owners):
        need, have = self.required(owners), self.available()
        return need, have, [max(0, n - h) for n, h in zip(need, have, strict=True)]

    def free_room(self, owners, target: float, trigger: float):
        need, have, _ = self.stats(owners)
        capacity = self.physical

        def room(ratio: float) -> int:
            return math.ceil(capacity * ratio) if capacity > 0 and ratio > 0 else 0

        deficits = []
        for n, h in zip(need, have, strict=True):
            if h >= n + room(trigger):
                deficits.append(0)
            else:
                deficits.append(max(0, n + room(target) - h))
        return need, have, deficits

    def choose(self, owner: int, k: int) -> list[int]:
        """k free pages of a lane holding at least k: the description's rule, brute force."""
        lane = self.free[owner]
        prefix = lane[:k]
        if self.selector == "fifo" or self.consecutive(prefix):
            return prefix
        free_ordinals = {self.ordinal(p) for p in lane}
        for start in range(self.physical):  # lowest addressed run first
            if all(start + i in free_ordinals for i in range(k)):
                return [owner + 1 + self.cp * (start + i) for i in range(k)]
        return prefix

    def select(self, owners):
        """(pages per position, {owner: (free pages taken, release count)}) or None."""
        need = self.required(owners)
        taken = {}
        for owner, k in enumerate(need):
            if k == 0:
                continue
            if len(self.free[owner]) >= k:
                taken[owner] = (self.choose(owner, k), 0)
            elif len(self.free[owner]) + len(self.release[owner]) >= k:
                taken[owner] = (list(self.free[owner]), k - len(self.free[owner]))
            else:
                return None
        queues = {o: f + self.release[o][:r] for o, (f, r) in taken.items()}
        return [queues[o].pop(0) for o in owners], taken

    def tokens(self, pages):
        return [p * self.page_size + i for p in pages for i in range(self.page_size)]

    def alloc(self, owners):
        plan = self.select(owners)
        if plan is None:
            return None
        pages, taken = plan
        for owner, (chosen, released) in taken.items():
            self.free[owner] = [p for p in self.free[owner] if p not in chosen]
            self.release[owner] = self.release[owner][released:]
        self.allocated |= set(pages)
        return self.tokens(pages)

    def free_tokens(self, tokens: list[int]) -> None:
        ps = self.page_size
        rows = [tokens[i : i + ps] for i in range(0, len(tokens), ps)]
        pages = [row[0] // ps for row in rows]
        ok = (
            len(tokens) % ps == 0
            and all(
                row == [p * ps + i for i in range(ps)] for row, p in zip(rows, pages, strict=True)
            )
            and len(set(pages)) == len(pages)
            and all(p in self.allocated for p in pages)
        )
        if not ok:
            raise ValueError(tokens)
        for page in pages:
            self.allocated.discard(page)
            self.release[(page - 1) % self.cp].append(page)
        if self.order == "sorted":
            self.release = [sorted(lane) for lane in self.release]

    def lanes(self):
        return tuple(map(tuple, self.free)), tuple(map(tuple, self.release))
