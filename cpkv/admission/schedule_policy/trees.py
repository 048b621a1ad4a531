"""The two prefix trees of SGLang's cache-aware policies, over trace block hashes.

A request's tokens are its prompt blocks (``hash_ids``; block ``i`` holds ``min(block_size,
prompt_tokens - i * block_size)`` tokens, the same tokens wherever the hash appears) followed
by its output tokens, which no other request shares. Two requests share a prefix of whole
blocks while their hashes agree, and inside a block as many tokens as the shorter of the two
holds; different hashes differ from their first token. A request without ``hash_ids`` shares
nothing. On this token model:

* :class:`WaitingPrefixTree` is SGLang's in-batch ``waiting_queue_radix_tree`` (a simulated
  ``RadixCache`` with page size 1, reset before every ordering): ``match`` is the number of
  leading tokens a request shares with the requests inserted so far, ``insert`` adds one.
* :func:`dfs_weight_order` is ``BasePrefixCache.dfs_weight_order``: requests are hung on the
  device tree at the end of their device prefix and taken depth first, heavier subtrees (more
  waiting requests) first, ties by the order in which the sibling nodes were created, each
  node's own requests after its subtree (queue order among them), the uncached ones last.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

SiblingRank = Callable[[Hashable], Any]
"""When a node of the device tree was created: smaller first. Called with a block hash, or
with a request's ``rid`` for the private prefix of a request without ``hash_ids``."""


class WaitingPrefixTree:
    """The in-batch tree: nodes ``[tokens held, children by hash]``, rebuilt per ordering.

    ``max_tokens`` (the deferral threshold) bounds the work: only the blocks holding a
    request's first ``max_tokens`` tokens are inserted and matched, so :meth:`match` returns
    ``min(shared tokens, tokens of those blocks)``, which is at least ``max_tokens`` exactly
    when the whole match is (``None``: whole prompts).
    """

    __slots__ = ("block_size", "max_blocks", "root")

    def __init__(self, block_size: int, max_tokens: int | None = None) -> None:
        self.block_size = block_size
        if max_tokens is None:
            self.max_blocks: int | None = None
        else:
            self.max_blocks = -(-max_tokens // block_size) if max_tokens > 0 else 0
        self.root: dict[Hashable, list[Any]] = {}

    def reset(self) -> None:
        self.root = {}

    def match(self, hash_ids: Sequence[int] | None, prompt_tokens: int) -> int:
        """Leading tokens this prompt shares with the inserted requests (see the class)."""
        if not hash_ids:
            return 0
        if self.max_blocks is not None:
            hash_ids = hash_ids[: self.max_blocks]
        size = self.block_size
        children = self.root
        matched = 0
        left = prompt_tokens
        for block in hash_ids:
            if left <= 0:
                break
            want = size if left > size else left
            node = children.get(block)
            if node is None:
                break
            held = node[0]
            if held < want:  # the tree's copy of this block stops first
                return matched + held
            matched += want
            if want < size:  # the prompt stops inside the block: output tokens follow
                break
            left -= size
            children = node[1]
        return matched

    def insert(self, hash_ids: Sequence[int] | None, prompt_tokens: int) -> None:
        """Add a request's prompt blocks (its output tokens are its own: never matched)."""
        if not hash_ids:
            return
        if self.max_blocks is not None:
            hash_ids = hash_ids[: self.max_blocks]
        size = self.block_size
        children = self.root
        left = prompt_tokens
        for block in hash_ids:
            if left <= 0:
                break
            want = size if left > size else left
            node = children.get(block)
            if node is None:
                node = children[block] = [want, {}]
            elif node[0] < want:
                node[0] = want
            left -= size
            children = node[1]


def dfs_weight_order(
    hash_ids: Sequence[Sequence[int] | None],
    prompt_tokens: Sequence[int],
    device_prefix: Sequence[int],
    rids: Sequence[str],
    block_size: int,
    sibling_rank: SiblingRank | None = None,
) -> list[int]:
    """Queue positions in SGLang's dfs-weight order.

    Request ``i`` sits where its device prefix ``device_prefix[i]`` (tokens, as matched, not
    capped) ends: in block ``(D - 1) // block_size`` of its path, ``D - k * block_size``
    tokens in. Requests ending in the same block at different offsets are on one chain of
    nodes (the shorter is the ancestor). Tokens matched past the prompt blocks (its own
    outputs) and the prefix of a request without hashes hang on a private node named by the
    request's ``rid``. Siblings are sorted by subtree weight, then ``sibling_rank`` (when
    given), then first appearance in the queue.
    """
    size = block_size
    # node: [weight, children {key: node}, stops {offset: [positions]}]
    root: list[Any] = [0, {}, {}]
    uncached: list[int] = []
    for i, device in enumerate(device_prefix):
        if device <= 0:
            uncached.append(i)
            continue
        blocks = hash_ids[i]
        n_blocks = min(len(blocks), -(-prompt_tokens[i] // size)) if blocks else 0
        last = (device - 1) // size  # the block holding the last matched token
        node = root
        if n_blocks:
            children = root[1]
            for block in blocks[: min(last + 1, n_blocks)]:
                child = children.get(block)
                if child is None:
                    child = children[block] = [0, {}, {}]
                child[0] += 1
                children = child[1]
            node = child
        if last < n_blocks:
            offset = device - last * size
        else:  # matched past its hashed blocks: its own tokens, a private node
            children = node[1]
            key = rids[i]
            child = children.get(key)
            if child is None:
                child = children[key] = [0, {}, {}]
            child[0] += 1
            node = child
            offset = device
        stops = node[2]
        at = stops.get(offset)
        if at is None:
            stops[offset] = [i]
        else:
            at.append(i)

    order: list[int] = []
    rank = sibling_rank
    # iterative post-order: ("visit", node) expands, ("emit", node) writes its own stops
    stack: list[tuple[bool, list[Any]]] = [(False, root)]
    pop, push, extend = stack.pop, stack.append, order.extend
    while stack:
        emit, node = pop()
        children = node[1]
        if emit or not children:  # after its subtree (or a leaf): the node's own requests
            stops = node[2]
            if len(stops) == 1:
                extend(next(iter(stops.values())))
            elif stops:
                for offset in sorted(stops, reverse=True):
                    extend(stops[offset])
            continue
        push((True, node))
        if len(children) == 1:
            push((False, next(iter(children.values()))))
            continue
        if rank is None:
            ranked = sorted(children.values(), key=lambda c: -c[0])
        else:
            ranked = [
                c for _, c in sorted(children.items(), key=lambda kv: (-kv[1][0], rank(kv[0])))
            ]
        for child in reversed(ranked):
            push((False, child))
    order.extend(uncached)
    return order
