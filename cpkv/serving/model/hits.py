"""The prefix hits of the serving engine's requests.

A request's hits are fixed (``l1_cached_tokens`` / ``l2_cached_tokens``) or, for trace
requests with a tiered cache, looked up when the policy examines it (``touch=False``) and
again, touching the LRU as SGLang's match does, when it is admitted. Hits are rounded
down to whole KV blocks: ``D = floor(l1)``, ``H = floor(l1 + l2) - D``.

A lookup is memoised until the cache next changes (a finished request inserts its
blocks). :meth:`PrefixHits.l1_upper` bounds the L1 hit without a lookup: a run of cached
leading blocks only grows when the block that ended it is inserted again, so when that
block has not been inserted since the memo, the memo's ``D`` is still an upper bound
(evictions can only shorten the run). The first-fit scans use it to skip requests that
cannot fit even with that hit.

Memory stays with the live requests: a request's memo goes when it ends (:meth:`forget`),
and the versions of inserted blocks are kept only while a live memo is older than them
(the record of a block inserted before every live memo answers nothing: it is dropped when
the record has doubled since the last pruning).
"""

from __future__ import annotations

from typing import Any

from cpkv.serving.model.request import Req
from cpkv.workload.request import floor_page


class PrefixHits:
    """Hits of waiting requests, from their fixed values or the tiered cache."""

    def __init__(self, cache: Any, block_size: int) -> None:
        self.cache, self.block_size = cache, block_size
        self.version = 0
        self.memo: dict[int, tuple[int, int, int, int, int]] = {}  # i: version, D, H, lo, hi
        self.inserted_at: dict[int, int] = {}  # block hash: version of its last insert
        self.prune_at = 1024  # prune inserted_at when it reaches this size

    def hit(self, r: Req) -> tuple[int, int]:
        """``(D, H)``: the L1 hit and the L2 hit after it, in whole blocks."""
        block = self.block_size
        if self.cache is None or r.hash_ids is None:  # floor_page, inline
            l1 = r.fixed_l1_tokens
            device = l1 // block * block
            return device, (l1 + r.fixed_l2_tokens) // block * block - device
        memo = self.memo.get(r.index)
        if memo is not None and memo[0] == self.version:
            return memo[1], memo[2]
        cache = self.cache
        found = cache.lookup(r.hash_ids, r.prompt_tokens, False)
        l1, l2 = found.l1_tokens, found.l2_tokens
        device = floor_page(l1, block)
        host = floor_page(l1 + l2, block) - device
        # the blocks where the L1 run may have ended (hits are floored to the cache's page)
        page, size = cache.page_size, cache.block_size
        lo, hi = -1, -1
        if l1 < (r.prompt_tokens - 1) // page * page:  # not at its cap: it could grow
            lo, hi = l1 // size, (l1 + page - 1) // size
        self.memo[r.index] = (self.version, device, host, lo, hi)
        return device, host

    def l1_upper(self, r: Req) -> int | None:
        """An upper bound on ``D`` that needs no lookup, or None when there is none."""
        if self.cache is None or r.hash_ids is None:
            return floor_page(r.fixed_l1_tokens, self.block_size)
        memo = self.memo.get(r.index)
        if memo is None:
            return None
        version, device, _, lo, hi = memo
        if version == self.version or lo < 0:
            return device
        inserted, hashes = self.inserted_at, r.hash_ids
        for k in range(lo, min(hi, len(hashes) - 1) + 1):
            if inserted.get(hashes[k], -1) > version:
                return None
        return device

    def touch(self, r: Req) -> None:
        """Admission: the match updates the LRU (same result as the examination's)."""
        if self.cache is not None and r.hash_ids is not None:
            self.cache.lookup(r.hash_ids, r.prompt_tokens, True)

    def insert(self, r: Req) -> None:
        """A finished request's prompt blocks enter the cache."""
        if self.cache is None or r.hash_ids is None:
            return
        self.cache.insert(r.hash_ids, r.prompt_tokens)
        self.version += 1
        version, inserted = self.version, self.inserted_at
        for block in r.hash_ids:
            inserted[block] = version
        if len(inserted) >= self.prune_at:
            self._prune()

    def forget(self, r: Req) -> None:
        """``r`` ended: its memo goes."""
        if self.memo:
            self.memo.pop(r.index, None)

    def _prune(self) -> None:
        """Drop the blocks inserted no later than the oldest live memo: ``l1_upper`` only asks
        whether a block was inserted *after* a memo."""
        oldest = min((m[0] for m in self.memo.values()), default=self.version)
        self.inserted_at = {h: v for h, v in self.inserted_at.items() if v > oldest}
        self.prune_at = max(1024, 2 * len(self.inserted_at))
