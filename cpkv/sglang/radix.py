"""SGLang 0.5.23's radix cache over the KV pool (its full-attention part, no host tier).

The tree holds token sequences, page by page: every key is a whole number of pages, a node's
children are keyed by their first page. A node on the device holds one KV slot per token of
its key; the slots are the pool's (counted by the pool, :mod:`cpkv.sglang.memory`). What
SGLang's cache does and the model keeps:

* ``match(tokens)``: the longest page-aligned prefix in the tree; a node matched part way is
  split there. The nodes on the matched path are stamped as just used, the deepest newest
  (SGLang's access-time counter: one stamp for the deepest, each ancestor 1e-5 older).
* ``insert(tokens)``: the tokens' page-aligned prefix enters the tree; what the tree holds
  already is a duplicate (the inserting request's slots for it are freed by the caller), the
  rest becomes a new leaf. Every node walked is stamped.
* locks: a request holds the path from its last node to the root; a node with a lock is
  *protected*, one without *evictable* (``evictable_size``, ``protected_size``: tokens).
* ``evict(num_tokens)``: unlocked leaves, least recently used first (a parent that becomes a
  leaf joins the candidates), until ``num_tokens`` slots are freed; an evicted node leaves
  the tree.

``disabled`` (SGLang's ``--disable-radix-cache``): nothing is ever matched or inserted.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence


class Node:
    """A tree node: its key (tokens), children by first page, parent, lock count and last use."""

    __slots__ = ("key", "children", "parent", "lock_ref", "last_access", "created")

    def __init__(self, key: Sequence[int], parent: Node | None, stamp: float) -> None:
        self.key = key
        self.children: dict[object, Node] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = stamp
        self.created = stamp

    def __lt__(self, other: Node) -> bool:
        return self.last_access < other.last_access


class RadixTree:
    """The radix cache of one server (see the module docstring)."""

    def __init__(self, page_size: int, disabled: bool, release: Callable[[int], None]) -> None:
        self.page = page_size
        self.release = release  # frees the slots of evicted tokens
        self.disabled = disabled
        self.clock = 0.0
        self.root = Node(range(0), None, self._tick())
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self.leaves: set[Node] = set()  # unlocked nodes with no child
        # eviction candidates: (last use, leaf) for every leaf at its current last use, and
        # stale entries (a leaf since used again or gone), skipped when popped
        self.heap: list[tuple[float, Node]] = []

    # -- the access clock -----------------------------------------------------------------
    def _tick(self) -> float:
        stamp = self.clock
        self.clock += 1.0
        return stamp

    def _new_node(self, key: Sequence[int], parent: Node | None) -> Node:
        node = Node(key, parent, self._tick())
        node.created = self._tick()
        return node

    def _child_key(self, tokens: Sequence[int], at: int) -> object:
        if self.page == 1:
            return tokens[at]
        return tuple(tokens[at : at + self.page])

    def _common(self, key: Sequence[int], tokens: Sequence[int], at: int, end: int) -> int:
        """Tokens ``key`` shares with ``tokens[at:end]``, in whole pages."""
        n = min(len(key), end - at)
        if key[:n] == tokens[at : at + n]:
            same = n
        else:
            lo, hi = 0, n  # the first differing position by bisection on equal prefixes
            while lo < hi:
                mid = (lo + hi) // 2
                if key[: mid + 1] == tokens[at : at + mid + 1]:
                    lo = mid + 1
                else:
                    hi = mid
            same = lo
        return same // self.page * self.page

    # -- the leaf set ---------------------------------------------------------------------
    def _refresh_leaf(self, node: Node) -> None:
        if node is not self.root and node.lock_ref == 0 and not node.children:
            if node not in self.leaves:
                self.leaves.add(node)
                self._candidate(node)
        else:
            self.leaves.discard(node)

    def _candidate(self, node: Node) -> None:
        heap = self.heap
        heapq.heappush(heap, (node.last_access, node))
        if len(heap) > 4 * len(self.leaves) + 64:  # mostly stale: rebuild
            heap[:] = [(n.last_access, n) for n in self.leaves]
            heapq.heapify(heap)

    def _use(self, node: Node, stamp: float) -> None:
        node.last_access = stamp
        if node in self.leaves:
            self._candidate(node)

    # -- matching ---------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], limit: int) -> tuple[int, Node]:
        """The page-aligned prefix of ``tokens[:limit]`` the tree holds: its length and its
        last node (the root when nothing matches)."""
        if self.disabled:
            return 0, self.root
        limit = limit // self.page * self.page
        node, at = self.root, 0
        while at < limit:
            child = node.children.get(self._child_key(tokens, at))
            if child is None:
                break
            same = self._common(child.key, tokens, at, limit)
            if same < len(child.key):
                if same:
                    node = self._split(child, same)
                    at += same
                break
            node = child
            at += same
        self._stamp_path(node)
        return at, node

    def _stamp_path(self, node: Node) -> None:
        stamp = self._tick()
        self._use(node, stamp)  # (only the deepest can be a leaf)
        node = node.parent
        while node is not None:
            stamp -= 0.00001
            node.last_access = stamp
            node = node.parent

    def _split(self, child: Node, length: int) -> Node:
        """Split ``child`` after ``length`` tokens; returns the new parent of the rest."""
        parent = child.parent
        assert parent is not None
        head = self._new_node(child.key[:length], parent)
        head.created = child.created
        head.lock_ref = child.lock_ref
        parent.children[self._child_key(child.key, 0)] = head
        child.key = child.key[length:]
        child.parent = head
        head.children[self._child_key(child.key, 0)] = child
        self._use(child, self._tick())
        self._refresh_leaf(head)
        self._refresh_leaf(child)
        return head

    # -- inserting --------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], protected_len: int) -> tuple[int, int, Node]:
        """Insert the page-aligned prefix of ``tokens``; returns ``(duplicate tokens,
        aligned length, last node)``: the tokens at or past ``protected_len`` that the tree
        held already (the caller frees its own slots for them) and the inserted length."""
        length = len(tokens) // self.page * self.page
        if self.disabled:
            return 0, length, self.root
        self.root.last_access = self._tick()
        if length == 0:
            return 0, length, self.root
        node, at, duplicates = self.root, 0, 0
        while at < length:
            child = node.children.get(self._child_key(tokens, at))
            if child is None:
                leaf = self._new_node(tokens[at:length], node)
                node.children[self._child_key(tokens, at)] = leaf
                self.evictable_size += length - at
                self._refresh_leaf(leaf)
                self._refresh_leaf(node)
                return duplicates, length, leaf
            self._use(child, self._tick())
            same = self._common(child.key, tokens, at, length)
            if same < len(child.key):
                child = self._split(child, same)
            start = max(protected_len - at, 0)
            if start < same:
                duplicates += same - start
            node = child
            at += same
        return duplicates, length, node

    # -- locks ----------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """A request holds ``node`` and its ancestors."""
        if self.disabled:
            return
        while node is not self.root:
            if node.lock_ref == 0:
                n = len(node.key)
                self.evictable_size -= n
                self.protected_size += n
                self.leaves.discard(node)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        """The request no longer holds ``node`` and its ancestors."""
        if self.disabled:
            return
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                n = len(node.key)
                self.evictable_size += n
                self.protected_size -= n
                self._refresh_leaf(node)
            node = node.parent  # type: ignore[assignment]

    # -- eviction ---------------------------------------------------------------------------
    def evict(self, enough: Callable[[], bool]) -> int:
        """Evict unlocked leaves, least recently used first, until ``enough()`` says the
        pool has room (checked after each leaf); returns the tokens freed. A parent left
        without children becomes a candidate at once."""
        heap, leaves = self.heap, self.leaves
        freed = 0
        while heap:
            stamp, node = heapq.heappop(heap)
            if node not in leaves or node.last_access != stamp:
                continue  # (stale)
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key, 0)]
            leaves.discard(node)
            n = len(node.key)
            self.evictable_size -= n
            freed += n
            self.release(n)
            self._refresh_leaf(parent)
            if enough():
                return freed
        return freed
