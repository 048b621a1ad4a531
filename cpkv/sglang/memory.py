"""The token-to-KV pool (its free pages) and the request-to-token pool (its free rows).

Only counts matter to scheduling: ``available()`` is SGLang's ``available_size()`` (free pages
times the page size), a request's extend takes ``ceil(seq / page) - ceil(prefix / page)`` new
pages (it continues its own partial last page), a decode step takes a page for every request
whose committed length is a multiple of the page size. Before an allocation the radix cache
evicts (:meth:`~cpkv.sglang.radix.RadixTree.evict`) until the demand fits, as SGLang's
``evict_to_free_tokens`` does: the extend's demand is counted conservatively (its tokens plus
a page per request), a decode step's as a page per request.
"""

from __future__ import annotations

from cpkv.sglang.radix import RadixTree


class KvPool:
    """Free pages of the KV pool, free rows of the request pool, and the radix cache over them."""

    def __init__(
        self, total_tokens: int, page_size: int, rows: int, disable_radix: bool,
        host_tokens: int | None = None,
    ) -> None:  # fmt: skip
        self.page = page_size
        self.total_pages = total_tokens // page_size
        self.free_pages = self.total_pages
        self.free_rows = rows
        self.tree = RadixTree(page_size, disable_radix, self.free_tokens, host_tokens)

    def available(self) -> int:
        """SGLang's ``available_size()``: free slots, whole pages."""
        return self.free_pages * self.page

    def free_tokens(self, tokens: int) -> None:
        """Give back the pages of ``tokens`` slots (whole pages)."""
        self.free_pages += tokens // self.page

    def pages_of(self, tokens: int) -> int:
        return -(-tokens // self.page)

    def make_room(self, tokens: int) -> None:
        """Evict from the radix cache until ``tokens`` slots are free (or nothing is left)."""
        if self.available() < tokens:
            self.tree.evict(lambda: self.available() >= tokens)

    def take_for_load(self, tokens: int) -> bool:
        """Slots for a host hit loaded back (evicting device cache for them): taken, or
        False when even eviction does not free enough."""
        self.make_room(tokens)
        if self.available() < tokens:
            return False
        self.free_pages -= tokens // self.page
        return True

    def take_pages(self, pages: int) -> None:
        if pages > self.free_pages:
            raise RuntimeError(
                f"out of KV memory: {pages} pages wanted, {self.free_pages} free "
                f"({self.tree.evictable_size} tokens evictable)"
            )
        self.free_pages -= pages
