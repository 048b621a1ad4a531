"""A tiered prefix-cache model of SGLang HiCache: L1 (device radix cache) and L2 (host cache).

Blocks are trace prefix blocks (`hash_ids`), each holding the tokens it covers in the request
that inserted it (a partial last block holds `input_length - (n - 1) * block_size` tokens, and
occupies that many tokens). Each tier is an LRU over blocks with a token capacity (`None` =
unlimited). Rules, chosen to match SGLang's radix/HiCache behaviour at block granularity:

* Insert (`insert`): every block of the request goes to L1 and, write-through, to L2, block by
  block from the last block to the first, so a prefix block is always more recently used than
  its children: the LRU victim is then always a leaf, as in SGLang's leaf-only eviction, and
  each tier stays prefix-closed.
* L1 evicts its LRU block; the block stays in L2. L2 evicts its LRU block among those *not* in
  L1 (SGLang's host pool only evicts nodes already evicted from the device), so L1 is always a
  subset of L2; this needs `l2 >= l1` capacity (or L2 off: `l2_tokens=0`).
* A block that cannot fit (larger than the tier, or no evictable room) is not inserted there;
  a block that L2 cannot hold is dropped from L1 too, so that L1 stays a subset of L2.
* Lookup (`lookup`): the hit is the longest run of leading blocks present, first in L1, then
  continuing in L2. A stored block holding fewer tokens than the request's block ends the run
  after those tokens. Totals are capped at `input_length - 1` (one token is always computed)
  and rounded down to whole pages: `l1 = floor_page(min(run_l1, cap))`,
  `l1 + l2 = floor_page(min(run_l1 + run_l2, cap))`. With `touch=True` the hit blocks become
  most recently used (SGLang's `match_prefix` updates access times).

In-flight requests' blocks are not locked against eviction (the model has no running set).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from cpkv.core.schema import FieldError
from cpkv.core.schema.limits import MAX_TOKENS, TOKENS_WHY
from cpkv.trace.readers import Trace

MAX_HICACHE_RATIO = 1e6


@dataclass(frozen=True)
class CacheConfig:
    """Cache capacities in tokens (`None` = unlimited); also the `cache` block of configs.

    L2 is `l2_tokens` when set (`0` turns L2 off), else `floor(hicache_ratio x l1_tokens)`
    when a ratio is set (SGLang's `--hicache-ratio`; like SGLang's `--hicache-size`, an
    absolute size overrides the ratio), else unlimited. Hits are rounded down to `page_size`.
    """

    l1_tokens: int | None = None
    l2_tokens: int | None = None
    hicache_ratio: float | None = None
    page_size: int = 1

    def validate(self) -> None:
        """Raise `FieldError` (a `ConfigError`) naming the offending key."""
        self.capacities()

    def capacities(self) -> tuple[int | None, int | None]:
        """Resolved `(l1, l2)` token capacities (`None` = unlimited, `l2 = 0`: no L2)."""
        for key in ("l1_tokens", "l2_tokens"):
            value = getattr(self, key)
            if value is not None and (type(value) is not int or value < 0):
                raise FieldError(key, f"must be null (unlimited) or an integer >= 0, got {value!r}")
            if value is not None and value > MAX_TOKENS:
                raise FieldError(key, f"must be <= {MAX_TOKENS} ({TOKENS_WHY}), got {value}")
        page = self.page_size
        if type(page) is not int or page < 1:
            raise FieldError("page_size", f"must be an integer >= 1, got {page!r}")
        if page > MAX_TOKENS:
            raise FieldError("page_size", f"must be <= {MAX_TOKENS} ({TOKENS_WHY}), got {page}")
        l1, l2 = self.l1_tokens, self.l2_tokens
        ratio = self.hicache_ratio
        if ratio is not None and (type(ratio) not in (int, float) or not ratio >= 1):
            raise FieldError(
                "hicache_ratio", f"must be null or a number >= 1 (L2 holds L1), got {ratio!r}"
            )
        if ratio is not None and ratio > MAX_HICACHE_RATIO:
            raise FieldError(
                "hicache_ratio",
                f"must be <= {MAX_HICACHE_RATIO:g} (host memory a million times the device's: "
                f"beyond any machine), got {ratio!r}",
            )
        if ratio is not None and l2 is None:
            l2 = None if l1 is None else int(l1 * ratio)
        if l2 != 0 and l2 is not None and (l1 is None or l2 < l1):
            shown = "null (unlimited)" if l1 is None else l1
            raise FieldError(
                "l2_tokens",
                f"{l2} is smaller than l1_tokens={shown}; under write-through L2 holds every L1 block:"
                " allowed: >= l1_tokens, null (unlimited) or 0 (no L2)",
            )
        return l1, l2


DEFAULT_CACHE = CacheConfig(l1_tokens=2_097_152, l2_tokens=None, hicache_ratio=2.0, page_size=1)
"""The configs' default: 2 Mi tokens of L1 (about 10% of the Mooncake synthetic trace's working
set) and SGLang's default `hicache_ratio` of 2 for L2."""


class Hit(NamedTuple):
    """Cached tokens of one lookup, capped at `input_length - 1` and page aligned (a named
    tuple: a serving run makes millions of them)."""

    l1_tokens: int
    l2_tokens: int


class _Tier:
    """An LRU of blocks -> tokens held, with a token capacity (`None` = unlimited)."""

    __slots__ = ("blocks", "capacity", "used")

    def __init__(self, capacity: int | None) -> None:
        self.blocks: OrderedDict[int, int] = OrderedDict()
        self.capacity = capacity
        self.used = 0

    def put(self, block: int, tokens: int, pinned: dict[int, int] | None) -> None:
        """Make `block` hold at least `tokens` and be most recent; evict LRU blocks not in
        `pinned` to make room. A block that cannot get room is left as it was."""
        blocks = self.blocks
        held = blocks.get(block)
        if held is not None:
            blocks.move_to_end(block)
            if held >= tokens:
                return
            grow = tokens - held
        else:
            grow = tokens
        cap = self.capacity
        if cap is not None and self.used + grow > cap:
            if pinned is None:
                if tokens > cap:
                    return
                while self.used + grow > cap:  # `block` is most recent: the others go first
                    self.used -= blocks.popitem(last=False)[1]
            elif not self._evict_unpinned(self.used + grow - cap, block, pinned):
                return
        blocks[block] = tokens
        self.used += grow

    def _evict_unpinned(self, need: int, keep: int, pinned: dict[int, int]) -> bool:
        """Evict least recent blocks other than `keep` and those in `pinned` until `need`
        tokens are free; evict nothing and return False when that is impossible."""
        blocks = self.blocks
        victims = []
        for victim, tokens in blocks.items():
            if victim != keep and victim not in pinned:
                victims.append(victim)
                need -= tokens
                if need <= 0:
                    break
        if need > 0:
            return False
        for victim in victims:
            self.used -= blocks.pop(victim)
        return True


class TieredPrefixCache:
    """The L1/L2 prefix cache. `lookup` and `insert` are separate so a replay can insert right
    after lookup and a serving simulation can insert when a request finishes."""

    def __init__(self, block_size: int, config: CacheConfig) -> None:
        l1, l2 = config.capacities()
        self.block_size = block_size
        self.page_size = config.page_size
        self.l1 = _Tier(l1)
        self.l2 = None if l2 == 0 else _Tier(l2)
        self.l2_pinned = self.l1.blocks  # blocks L2 never evicts (every L1, for a shared L2)

    def lookup(self, hash_ids: Sequence[int], input_length: int, touch: bool = True) -> Hit:
        """The L1 and L2 hit of a prompt of `input_length` tokens with these prefix blocks."""
        size = self.block_size
        last = len(hash_ids) - 1
        l1 = self.l1.blocks
        l2 = self.l2.blocks if self.l2 is not None else None
        run1 = run2 = i = 0
        n1 = 0  # blocks touched in L1
        for i, block in enumerate(hash_ids):
            want = size if i < last else input_length - i * size
            held = l1.get(block, 0)
            if held < want:
                run1 += held
                n1 = i + (held > 0)
                break
            run1 += want
        else:
            n1 = i = len(hash_ids)
        n2 = i
        if l2 is not None and i < len(hash_ids):
            base = run1 - (i * size)  # tokens of block i already counted in L1 (partial hit)
            for j in range(i, len(hash_ids)):
                want = size if j < last else input_length - j * size
                held = l2.get(hash_ids[j], 0)
                run2 += max(0, min(held, want) - base)
                base = 0
                n2 = j + (held > 0)
                if held < want:
                    break
            else:
                n2 = len(hash_ids)
        if touch:
            self._touch(hash_ids, n1, max(n1, n2))
        cap = input_length - 1
        page = self.page_size
        cached1 = min(run1, cap) // page * page
        cached = min(run1 + run2, cap) // page * page
        return Hit(cached1, cached - cached1)

    def _touch(self, hash_ids: Sequence[int], n1: int, n2: int) -> None:
        if self.l2 is not None:
            move = self.l2.blocks.move_to_end
            for j in range(n2 - 1, -1, -1):
                move(hash_ids[j])
        move = self.l1.blocks.move_to_end
        for j in range(n1 - 1, -1, -1):
            move(hash_ids[j])

    def insert(self, hash_ids: Sequence[int], input_length: int) -> None:
        """Cache every block of the prompt: L1 first, then write-through to L2, last block first."""
        size = self.block_size
        l1, l2 = self.l1, self.l2
        l1_blocks = l1.blocks  # L2 never evicts these
        tokens = input_length - (len(hash_ids) - 1) * size
        l2_touch = l2.blocks.move_to_end if l2 is not None else None
        for i in range(len(hash_ids) - 1, -1, -1):
            block = hash_ids[i]
            held = l1_blocks.get(block)
            if held is not None and held >= tokens:  # already cached whole: touch both tiers
                l1_blocks.move_to_end(block)
                if l2_touch is not None:
                    l2_touch(block)  # in L2 too: L1 is a subset of L2
            else:
                l1.put(block, tokens, None)
                if l2 is not None:
                    l2.put(block, tokens, self.l2_pinned)
                    if l2.blocks.get(block, 0) < l1_blocks.get(block, 0):
                        # L2 found no room (its pinned copies are larger): keep L1 inside L2
                        l1.used -= l1_blocks.pop(block)
            tokens = size


@dataclass(frozen=True)
class CachedRequest:
    """A trace request after the cache replay: an admission request plus its trace identity."""

    index: int
    rid: str
    arrival_ms: float
    input_length: int
    l1_cached_tokens: int
    l2_cached_tokens: int
    extend_tokens: int
    max_new_tokens: int


def replay(trace: Trace, config: CacheConfig) -> tuple[CachedRequest, ...]:
    """Replay a trace through a cold cache, in trace order.

    Each request is looked up, then inserted at once (as if it finished before the next one
    arrives), so a request sees every earlier request's blocks. `rid` is `r<index>`.
    """
    cache = TieredPrefixCache(trace.block_size, config)
    lookup, insert = cache.lookup, cache.insert
    out = []
    for req in trace.requests:
        hit = lookup(req.hash_ids, req.input_length, False)
        insert(req.hash_ids, req.input_length)
        l1, l2 = hit.l1_tokens, hit.l2_tokens
        out.append(
            CachedRequest(
                req.index,
                f"r{req.index}",
                req.arrival_ms,
                req.input_length,
                l1,
                l2,
                req.input_length - l1 - l2,
                req.output_length,
            )
        )
    return tuple(out)
