"""SGLang 0.5.23's radix cache over the KV pool (its full-attention part), with an optional
host tier.

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
  *protected*, one without *evictable* (``evictable_size``, ``protected_size``: tokens on the
  device).
* ``evict(enough)``: unlocked device leaves (no child on the device), least recently used
  first (a parent that becomes one joins the candidates), until the pool has room.

``disabled`` (SGLang's ``--disable-radix-cache``): nothing is ever matched or inserted.

The host tier (``host_tokens``; SGLang's HiCache with its default ``write_through`` policy,
on top of the loop as cpkv's extension): every node an insert walks past what the request
inserted before, and every new leaf, is copied to the host when it is not there (host leaves
evicted least recently used first to make room; no room: not copied). Device eviction demotes
a node with a host copy (it stays in the tree, on the host only) and deletes one without
(with the host-only nodes below it). A match walks on through host-only nodes: the device
prefix, then the host hit after it; :meth:`RadixTree.load_back` brings a host hit back onto
the device (all of it, at least ``threshold`` tokens, evicting device cache for the slots). An
insert over a host-only node adopts the inserting request's fresh slots for it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import NamedTuple

from cpkv.sglang.tokens import TokenRuns, shared_prefix


class Node:
    """A tree node: its key (tokens), children by first page, parent, lock count, last use,
    and where its KV is (``on_device``, ``on_host``)."""

    __slots__ = (
        "key", "children", "parent", "lock_ref", "last_access", "created", "on_device", "on_host",
    )  # fmt: skip

    def __init__(self, key: Sequence[int], parent: Node | None, stamp: float) -> None:
        self.key = key
        self.children: dict[object, Node] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = stamp
        self.created = stamp
        self.on_device = True
        self.on_host = False

    def __lt__(self, other: Node) -> bool:
        return self.last_access < other.last_access

    def __hash__(self) -> int:  # (by identity; compiled, a class with __lt__ has no hash)
        return id(self)


class Match(NamedTuple):
    """A match: the device prefix and its last node, then the host hit after it and the
    deepest node matched (the device node when there is no host hit)."""

    device: int
    device_node: Node
    host: int
    node: Node


class LruLeaves:
    """A set of leaves and their eviction order: (last use, leaf) for every leaf at its
    current last use, and stale entries (a leaf since used again or gone) skipped when
    popped."""

    def __init__(self) -> None:
        self.members: set[Node] = set()
        self.heap: list[tuple[float, Node]] = []

    def add(self, node: Node) -> None:
        if node not in self.members:
            self.members.add(node)
            self.push(node)

    def discard(self, node: Node) -> None:
        self.members.discard(node)

    def push(self, node: Node) -> None:
        heap = self.heap
        heapq.heappush(heap, (node.last_access, node))
        if len(heap) > 4 * len(self.members) + 64:  # mostly stale: rebuild
            heap[:] = [(n.last_access, n) for n in self.members]
            heapq.heapify(heap)

    def pop(self) -> Node | None:
        """The least recently used leaf, taken out (None: no leaf)."""
        heap, members = self.heap, self.members
        while heap:
            stamp, node = heapq.heappop(heap)
            if node in members and node.last_access == stamp:
                members.discard(node)
                return node
        return None


class HostTier:
    """The host copies: their tokens, the room for them, the host-only leaves."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.leaves = LruLeaves()  # host-only nodes without children


class RadixTree:
    """The radix cache of one server (see the module docstring)."""

    def __init__(
        self, page_size: int, disabled: bool, release: Callable[[int], None],
        host_tokens: int | None = None,
    ) -> None:  # fmt: skip
        self.page = page_size
        self.release = release  # frees the device slots of evicted tokens
        self.disabled = disabled
        self.clock = 0.0
        self.root = Node(range(0), None, self._tick())
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self.device_leaves = LruLeaves()  # unlocked device nodes without a child on the device
        self.host = None if host_tokens is None else HostTier(host_tokens)

    @property
    def host_size(self) -> int:
        """Tokens with a host copy."""
        return 0 if self.host is None else self.host.used

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
        if type(key) is TokenRuns or type(tokens) is TokenRuns:
            return shared_prefix(key, tokens, at, n) // self.page * self.page
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

    # -- the leaf sets ----------------------------------------------------------------------
    def _refresh_leaf(self, node: Node) -> None:
        """Whether ``node`` can be evicted from the device now (and, with a host tier, from
        the host)."""
        if node is self.root:
            return
        if (
            node.on_device
            and node.lock_ref == 0
            and (
                not node.children
                if self.host is None
                else not any(c.on_device for c in node.children.values())
            )
        ):
            self.device_leaves.add(node)
        else:
            self.device_leaves.discard(node)
        if self.host is not None:
            if node.on_host and not node.on_device and not node.children:
                self.host.leaves.add(node)
            else:
                self.host.leaves.discard(node)

    def _use(self, node: Node, stamp: float) -> None:
        node.last_access = stamp
        if node in self.device_leaves.members:
            self.device_leaves.push(node)
        if self.host is not None and node in self.host.leaves.members:
            self.host.leaves.push(node)

    # -- matching ---------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], limit: int) -> tuple[int, Node]:
        """The page-aligned prefix of ``tokens[:limit]`` on the device: its length and its
        last node (the root when nothing matches)."""
        found = self.match_tiers(tokens, limit)
        return found.device, found.device_node

    def match_tiers(self, tokens: Sequence[int], limit: int) -> Match:
        """The page-aligned prefix of ``tokens[:limit]`` the tree holds (:class:`Match`)."""
        root = self.root
        if self.disabled:
            return Match(0, root, 0, root)
        limit = limit // self.page * self.page
        node, at = root, 0
        device, device_node = 0, root
        while at < limit:
            child = node.children.get(self._child_key(tokens, at))
            if child is None:
                break
            same = self._common(child.key, tokens, at, limit)
            if same < len(child.key):
                if same:
                    node = self._split(child, same)
                    at += same
                    if node.on_device:
                        device, device_node = at, node
                break
            node = child
            at += same
            if node.on_device:
                device, device_node = at, node
        self._stamp_path(node)
        return Match(device, device_node, at - device, node)

    def _stamp_path(self, node: Node) -> None:
        """``node`` and its ancestors were used now, the deeper the later (an ancestor is a
        device leaf too when its children are on the host only)."""
        stamp = self._tick()
        on: Node | None = node
        while on is not None:
            self._use(on, stamp)
            stamp -= 0.00001
            on = on.parent

    def _split(self, child: Node, length: int) -> Node:
        """Split ``child`` after ``length`` tokens; returns the new parent of the rest."""
        parent = child.parent
        assert parent is not None
        head = self._new_node(child.key[:length], parent)
        head.created = child.created
        head.lock_ref = child.lock_ref
        head.on_device, head.on_host = child.on_device, child.on_host
        parent.children[self._child_key(child.key, 0)] = head
        child.key = child.key[length:]
        child.parent = head
        head.children[self._child_key(child.key, 0)] = child
        self._use(child, self._tick())
        self._refresh_leaf(head)
        self._refresh_leaf(child)
        return head

    # -- inserting --------------------------------------------------------------------------
    def insert(
        self, tokens: Sequence[int], protected_len: int, inserted_len: int = 0
    ) -> tuple[int, int, Node]:
        """Insert the page-aligned prefix of ``tokens``; returns ``(duplicate tokens,
        aligned length, last node)``: the tokens at or past ``protected_len`` that the tree
        held on the device already (the caller frees its own slots for them) and the inserted
        length. With a host tier, the nodes past ``inserted_len`` (what the request inserted
        before) are copied to the host."""
        length = len(tokens) // self.page * self.page
        if self.disabled:
            return 0, length, self.root
        self.root.last_access = self._tick()
        if length == 0:
            return 0, length, self.root
        host = self.host
        copies: list[Node] = []
        node, at, duplicates = self.root, 0, 0
        while at < length:
            first = self._child_key(tokens, at)
            child = node.children.get(first)
            if child is None:
                leaf = self._new_node(tokens[at:length], node)
                node.children[first] = leaf
                self.evictable_size += length - at
                self._refresh_leaf(leaf)
                self._refresh_leaf(node)
                node = leaf
                if host is not None:
                    copies.append(leaf)
                break
            self._use(child, self._tick())
            same = self._common(child.key, tokens, at, length)
            if same < len(child.key):
                child = self._split(child, same)
            if not child.on_device:  # a host-only node takes the request's fresh slots
                self._onto_device(child)
            else:
                start = max(protected_len - at, 0)
                if start < same:
                    duplicates += same - start
            node = child
            at += same
            if host is not None and at > inserted_len:
                copies.append(child)
        for copied in copies:
            self._copy_to_host(copied)
        return duplicates, length, node

    def _onto_device(self, node: Node) -> None:
        """A host-only node's KV is on the device again (loaded back, or taken from a
        request's fresh slots)."""
        node.on_device = True
        n = len(node.key)
        if node.lock_ref:
            self.protected_size += n
        else:
            self.evictable_size += n
        self._refresh_leaf(node)
        if node.parent is not None:
            self._refresh_leaf(node.parent)

    def _copy_to_host(self, node: Node) -> None:
        """Write-through: a device node's copy on the host, room made by evicting host-only
        leaves (none: not copied)."""
        host = self.host
        if host is None or node.on_host or not node.on_device or node.parent is None:
            return
        n = len(node.key)
        while host.capacity - host.used < n:
            victim = host.leaves.pop()
            if victim is None:
                return
            self._delete(victim)
        node.on_host = True
        host.used += n

    # -- locks ----------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """A request holds ``node`` and its ancestors."""
        if self.disabled:
            return
        while node is not self.root:
            if node.lock_ref == 0 and node.on_device:
                n = len(node.key)
                self.evictable_size -= n
                self.protected_size += n
                self.device_leaves.discard(node)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        """The request no longer holds ``node`` and its ancestors."""
        if self.disabled:
            return
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0 and node.on_device:
                n = len(node.key)
                self.evictable_size += n
                self.protected_size -= n
                self._refresh_leaf(node)
            node = node.parent  # type: ignore[assignment]

    # -- eviction ---------------------------------------------------------------------------
    def evict(self, enough: Callable[[], bool]) -> int:
        """Evict unlocked device leaves, least recently used first, until ``enough()`` says
        the pool has room (checked after each leaf); returns the device tokens freed. A
        parent left without a child on the device becomes a candidate at once. With a host
        copy a node is demoted to the host, without one it is deleted."""
        freed = 0
        while True:
            node = self.device_leaves.pop()
            if node is None:
                return freed
            n = len(node.key)
            self.evictable_size -= n
            freed += n
            self.release(n)
            parent = node.parent
            assert parent is not None
            if node.on_host:
                node.on_device = False
                self._refresh_leaf(node)
            else:
                node.on_device = False
                self._delete(node)
            self._refresh_leaf(parent)
            if enough():
                return freed

    def _delete(self, node: Node) -> None:
        """Take ``node`` (off the device) out of the tree, with what hangs below it (host-only
        copies); their host room is freed."""
        host = self.host
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            self.device_leaves.discard(n)
            if host is not None:
                host.leaves.discard(n)
                if n.on_host:
                    host.used -= len(n.key)
        parent = node.parent
        assert parent is not None
        del parent.children[self._child_key(node.key, 0)]
        node.parent = None
        self._refresh_leaf(parent)

    # -- the host tier ----------------------------------------------------------------------
    def load_back(self, found: Match, threshold: int, room: Callable[[int], bool]) -> int:
        """Bring the host hit of ``found`` back onto the device: all of it or nothing, at
        least ``threshold`` tokens (and 1), when ``room(tokens)`` frees and takes the slots
        (the path is locked meanwhile, so that making room does not evict it). The tokens
        loaded (0: declined)."""
        tokens = found.host
        if tokens < max(1, threshold) or self.host is None:
            return 0
        path = []
        node = found.node
        while node is not found.device_node:
            path.append(node)
            node = node.parent  # type: ignore[assignment]
        self.lock(found.node)
        try:
            if not room(tokens):
                return 0
            for node in reversed(path):
                self._onto_device(node)
        finally:
            self.unlock(found.node)
        return tokens


def dfs_weight_order(root: Node, nodes: Sequence[Node]) -> list[int]:
    """SGLang's ``dfs_weight_order``: the indices of ``nodes`` (each request's last matched
    node) in a depth-first walk of the tree from ``root`` that visits heavier subtrees first
    (a subtree's weight: the requests whose node lies in it; ties keep the children's order)
    and lists a node's requests after its subtree's. Subtrees without a request add nothing
    to the order, so the walk keeps to the paths from the root to the requests' nodes."""
    at: dict[Node, list[int]] = {}
    weight: dict[Node, int] = {}
    for i, node in enumerate(nodes):
        at.setdefault(node, []).append(i)
        walk: Node | None = node
        while walk is not None:  # the node and its ancestors hold one more request
            weight[walk] = weight.get(walk, 0) + 1
            walk = walk.parent
    order: list[int] = []
    pending: list[tuple[Node, bool]] = [(root, False)]
    while pending:
        node, children_done = pending.pop()
        if children_done:
            order.extend(at.get(node, ()))
            continue
        pending.append((node, True))
        held = [c for c in node.children.values() if c in weight]
        held.sort(key=lambda c: -weight[c])
        pending.extend((c, False) for c in reversed(held))
    return order
