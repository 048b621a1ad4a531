"""The router's own approximate prefix tree: which prefixes it sent to which instance.

SGLang's router (``sgl-router``, ``src/policies/tree.rs``) never asks an engine what its
cache holds. It keeps one multi-tenant radix tree of the request texts it routed, each node
marked with the workers (tenants) it sent that prefix to and when, a per-tenant size (the
characters of the nodes it holds), and evicts each tenant's least recently used leaves when
its size exceeds ``max_tree_size`` (every ``eviction_interval_secs``). This module is that
tree over prefix *blocks* (a trace's ``hash_ids``; one key per block of ``block_tokens``
tokens) instead of characters; sizes are counted in blocks. Times are simulated
milliseconds. Where sgl-router takes "the first tenant" of a node (a hash-map order, in
effect arbitrary) this tree takes the lowest instance index, so that runs are deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


class UniqueBlocks(Sequence[Hashable]):
    """The prefix-block keys ``(rid, i)`` of blocks ``start`` to ``stop - 1`` of a request that
    shares no block with any other (a request without prefix information), held as the range:
    a prompt of any length costs the same few bytes. Slices are ranges too; it equals any
    sequence of the same keys."""

    __slots__ = ("rid", "start", "stop")

    def __init__(self, rid: Hashable, start: int, stop: int) -> None:
        self.rid, self.start, self.stop = rid, start, max(start, stop)

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            first, last, step = index.indices(len(self))
            if step != 1:
                return tuple(self[k] for k in range(first, last, step))
            return UniqueBlocks(self.rid, self.start + first, self.start + last)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return (self.rid, self.start + index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UniqueBlocks):
            return len(self) == len(other) and (
                not len(self) or (self.rid, self.start) == (other.rid, other.start)
            )
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))  # (as the tuple it equals)

    def __repr__(self) -> str:
        return f"UniqueBlocks({self.rid!r}, {self.start}, {self.stop})"


@dataclass(eq=False)
class Node:
    """An edge of blocks, its children by first block, and its tenants' last access times."""

    blocks: Sequence[Hashable]
    parent: Node | None = None
    children: dict[Hashable, Node] = field(default_factory=dict)
    tenants: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Match:
    """The longest prefix of a request the tree holds: ``blocks`` matched and the ``node``
    where the walk stopped (a partial match of its edge counts); ``tenants`` of that node."""

    blocks: int
    node: Node

    @property
    def tenants(self) -> list[int]:
        return sorted(self.node.tenants)


class PrefixTree:
    """A multi-tenant radix tree of block sequences (see the module docstring)."""

    def __init__(self, tenants: int) -> None:
        self.root = Node(())
        self.root.tenants = dict.fromkeys(range(tenants), 0.0)  # sgl-router: insert("") per worker
        self.size_blocks = [0] * tenants

    # -- queries (no side effects) ---------------------------------------------------------
    def match(self, blocks: Sequence[Hashable]) -> Match:
        """The deepest node the request's blocks reach (sgl-router's ``prefix_match``, without
        its timestamp refresh: see :meth:`touch`)."""
        node, i, n = self.root, 0, len(blocks)
        while i < n:
            child = node.children.get(blocks[i])
            if child is None:
                break
            shared = _shared(child.blocks, blocks, i)
            i += shared
            node = child
            if shared < len(child.blocks):
                break  # a partial match of the edge: stop here
        return Match(i, node)

    def smallest_tenant(self) -> int:
        """The tenant holding the fewest blocks (the lowest index among equals)."""
        sizes = self.size_blocks
        return min(range(len(sizes)), key=lambda t: (sizes[t], t))

    # -- updates ---------------------------------------------------------------------------
    def touch(self, match: Match, tenant: int, now_ms: float) -> None:
        """Refresh ``tenant``'s access time from the matched node up to the root (what
        sgl-router's ``prefix_match`` does for the tenant it returns)."""
        node: Node | None = match.node
        while node is not None:
            node.tenants[tenant] = now_ms
            node = node.parent

    def insert(self, blocks: Sequence[Hashable], tenant: int, now_ms: float) -> None:
        """Record that ``blocks`` went to ``tenant`` (sgl-router's ``insert``): every node on the
        path holds the tenant, edges split where the request leaves them, the tenant's size
        grows by the blocks of each node it did not hold yet."""
        node, i, n = self.root, 0, len(blocks)
        node.tenants[tenant] = now_ms
        while i < n:
            child = node.children.get(blocks[i])
            if child is None:
                leaf = Node(blocks[i:], node)
                node.children[blocks[i]] = leaf
                self._hold(leaf, tenant, now_ms)
                return
            shared = _shared(child.blocks, blocks, i)
            if shared < len(child.blocks):  # split: node -> head (shared part) -> child (rest)
                head = Node(child.blocks[:shared], node, tenants=dict(child.tenants))
                child.blocks = child.blocks[shared:]
                child.parent = head
                head.children[child.blocks[0]] = child
                node.children[blocks[i]] = head
                child = head
            self._hold(child, tenant, now_ms)
            node, i = child, i + shared

    def _hold(self, node: Node, tenant: int, now_ms: float) -> None:
        if tenant not in node.tenants:
            self.size_blocks[tenant] += len(node.blocks)
        node.tenants[tenant] = now_ms

    def evict(self, max_blocks: int) -> int:
        """Remove each tenant's least recently used leaves until it holds at most
        ``max_blocks`` (sgl-router's ``evict_tenant_by_size``); return the blocks removed."""
        heap: list[tuple[float, int, int, Node]] = []
        order = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant in _leaf_tenants(node):
                heap.append((node.tenants[tenant], tenant, order, node))
                order += 1
        heapq.heapify(heap)
        removed = 0
        while heap:
            _, tenant, _, node = heapq.heappop(heap)
            if self.size_blocks[tenant] <= max_blocks or tenant not in node.tenants:
                continue
            if node is self.root:
                continue  # the root holds every tenant for good (no blocks)
            del node.tenants[tenant]
            self.size_blocks[tenant] -= len(node.blocks)
            removed += len(node.blocks)
            parent = node.parent
            if not node.children and not node.tenants and parent is not None:
                del parent.children[node.blocks[0]]
            if parent is not None and tenant in _leaf_tenants(parent):
                heapq.heappush(heap, (parent.tenants[tenant], tenant, order, parent))
                order += 1
        return removed

    def held_blocks(self, tenant: int) -> int:
        """The blocks ``tenant`` holds, counted by walking the tree (a check of ``size_blocks``)."""
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if tenant in node.tenants:
                total += len(node.blocks)
        return total


def _shared(edge: Sequence[Hashable], blocks: Sequence[Hashable], start: int) -> int:
    n = min(len(edge), len(blocks) - start)
    if isinstance(edge, UniqueBlocks) and isinstance(blocks, UniqueBlocks):
        same = n > 0 and edge.rid == blocks.rid and edge.start == blocks.start + start
        return n if same else 0  # (a request's keys are consecutive: all or none)
    k = 0
    while k < n and edge[k] == blocks[start + k]:
        k += 1
    return k


def _leaf_tenants(node: Node) -> list[int]:
    """Tenants for which ``node`` is a leaf: they hold it and none of its children."""
    below = {t for child in node.children.values() for t in child.tenants}
    return sorted(t for t in node.tenants if t not in below)
