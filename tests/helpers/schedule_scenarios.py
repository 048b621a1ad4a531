"""Seeded random scenarios for the schedule-policy differential, and their token realisation.

A scenario is plain data: the prefix cache's contents (host tier, then the device prefixes),
waiting requests arriving over one or two ordering passes, and the policy knobs. Tokens are
realised from block hashes (block ``h``'s token ``t`` is ``h * SPAN + t + 1``), so a hash
is the same tokens wherever it appears; output tokens and the tokens of a request without
hashes are the request's own. The cache hits ``(D, H)`` the model is given are computed here
by brute force (longest common token prefix with the cached sequences, page floored), not by
any tree: independent of the model and of SGLang.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

SPAN = 1 << 16  # tokens per hash id (block sizes stay far below)
PRIVATE = 1 << 40  # base of a request's own tokens (no hashes)
OUTPUT = 1 << 44  # base of a request's output tokens
PER_REQUEST = 1 << 20


@dataclass
class WaitSpec:
    uid: int
    rid: str
    hash_ids: tuple[int, ...] | None
    prompt_tokens: int
    output_tokens: int
    max_new_tokens: int
    priority: int | None
    queue_entry: float
    arrival_processed: int


@dataclass
class CachedSeq:
    """A cached token sequence: a prefix of a hash path, or of a request's own tokens."""

    hash_ids: tuple[int, ...] | None
    private_uid: int | None
    tokens: int


@dataclass
class OrderScenario:
    label: str
    policy: str
    page_size: int
    block_size: int
    check_threshold: int
    deprioritize_threshold: int
    priority_on: bool
    low_first: bool
    seed: int
    cached: list[CachedSeq]
    device: list[tuple[int, int]]  # (index in cached, tokens kept on device)
    passes: list[tuple[list[WaitSpec], int]]  # (arrivals appended, processed_tokens)
    private_rids: dict[int, str] = field(default_factory=dict)


def prompt_ids(w: WaitSpec, block_size: int) -> list[int]:
    if w.hash_ids is None:
        return [PRIVATE + w.uid * PER_REQUEST + t for t in range(w.prompt_tokens)]
    out: list[int] = []
    for i, h in enumerate(w.hash_ids):
        n = min(block_size, w.prompt_tokens - i * block_size)
        out.extend(h * SPAN + t + 1 for t in range(n))
    return out


def output_ids(w: WaitSpec) -> list[int]:
    return [OUTPUT + w.uid * PER_REQUEST + t for t in range(w.output_tokens)]


def cached_ids(c: CachedSeq, block_size: int) -> list[int]:
    if c.hash_ids is None:
        return [PRIVATE + c.private_uid * PER_REQUEST + t for t in range(c.tokens)]
    out: list[int] = []
    for i, h in enumerate(c.hash_ids):
        n = min(block_size, c.tokens - i * block_size)
        if n <= 0:
            break
        out.extend(h * SPAN + t + 1 for t in range(n))
    return out


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def brute_hits(s: OrderScenario, w: WaitSpec) -> tuple[int, int]:
    """``(D, H)`` of calc_priority's match: prompt + output against the device prefixes and
    the host sequences, page floored, not capped."""
    key = prompt_ids(w, s.block_size) + output_ids(w)
    key_len = len(key) // s.page_size * s.page_size
    key = key[:key_len]
    page = s.page_size
    seqs = [cached_ids(c, s.block_size) for c in s.cached]
    best_all = max((_lcp(key, q) for q in seqs), default=0)
    best_dev = max((_lcp(key, seqs[i][:n]) for i, n in s.device), default=0)
    d = best_dev // page * page
    total = max(best_all, best_dev) // page * page
    return d, total - d


def creation_rank(s: OrderScenario):
    """The device tree's sibling order: the cached sequence that first created each node."""
    first: dict[object, int] = {}
    for k, c in enumerate(s.cached):
        if c.hash_ids is None:
            first.setdefault(s.private_rids.get(c.private_uid, f"?{c.private_uid}"), k)
            continue
        for i, h in enumerate(c.hash_ids):
            if c.tokens <= i * s.block_size:
                break
            first.setdefault(h, k)
    return lambda key: first.get(key, len(s.cached))


# -- generation ----------------------------------------------------------------------------


def _pick_policy(rng: random.Random) -> str:
    return rng.choice(
        ["fcfs", "fcfs", "lof", "lof", "random", "lpm", "lpm", "dfs-weight", "dfs-weight",
         "hrrn", "hrrn", "shortest-prefill-first", "shortest-prefill-first"]
    )  # fmt: skip


def random_order_scenario(
    seed: int, policy: str | None = None, size: int | None = None
) -> OrderScenario:
    """A scenario with shared prefixes, priorities, output lengths and two passes."""
    rng = random.Random(seed * 7919 + 17)
    policy = policy or _pick_policy(rng)
    block = rng.choice([4, 8, 16])
    page = rng.choice([1, 1, 4]) if block % 4 == 0 else 1
    check, dep = 32, 32
    if rng.random() < 0.4:
        check = rng.choice([-1, 0, block, 2 * block, 64])
        dep = rng.choice([0, 1, block, 2 * block, 3 * block, 48])
    processed = rng.randint(0, 6000)
    priority_on = policy in ("fcfs", "lof") and rng.random() < 0.6
    low_first = rng.random() < 0.5
    next_hash = [1]

    def fresh(n: int) -> list[int]:
        out = list(range(next_hash[0], next_hash[0] + n))
        next_hash[0] += n
        return out

    shared_tail: set[int] = set()
    roots = [fresh(rng.randint(1, 6)) for _ in range(rng.randint(1, 4))]
    paths: list[list[int]] = [list(r) for r in roots]

    def new_wait(uid: int) -> WaitSpec:
        if rng.random() < 0.12:
            hashes = None
            tokens = rng.randint(1, 6 * block)
        else:
            base = rng.choice(paths)
            keep = rng.randint(0, len(base))
            hashes = base[:keep] + fresh(rng.randint(0 if keep else 1, 4))
            if not hashes:
                hashes = fresh(1)
            if rng.random() < 0.45 and len(hashes) < len(base):  # end inside a shared block
                hashes = base[: len(hashes) + 1]
            paths.append(hashes)
            full = len(hashes) - 1
            tail = rng.randint(1, block) if rng.random() < 0.6 else block
            tokens = full * block + tail
            if rng.random() < 0.2 and hashes[-1] in shared_tail:  # another length of that block
                tokens = full * block + rng.randint(1, block)
            shared_tail.add(hashes[-1])
        output = rng.choice([0, 0, 0, rng.randint(1, 2 * block)])
        mx = rng.choice([1, 16, 128, 1024, 4096, 5000, rng.randint(1, 9000)])
        prio = rng.choice([None, 0, 0, 1, 2, 5, 11, 20, -3]) if priority_on else rng.choice([0, 3])
        return WaitSpec(
            uid, f"q{rng.randint(0, 999_999)}", None if hashes is None else tuple(hashes),
            tokens, output, mx, prio, float(rng.choice([1, 2, 3, 5, 8, 13]) + rng.randint(0, 3)),
            rng.randint(0, processed) if rng.random() < 0.85 else processed + rng.randint(0, 99),
        )  # fmt: skip

    n1 = size if size is not None else rng.choice([1, 2, 3, 5, 8, 12, 20, 30, 45])
    uid = 0
    first: list[WaitSpec] = []
    for _ in range(n1):
        first.append(new_wait(uid))
        uid += 1
    second: list[WaitSpec] = []
    for _ in range(rng.choice([0, 0, 1, 3, 6])):
        second.append(new_wait(uid))
        uid += 1
    rids: set[str] = set()
    for w in first + second:  # unique rids, as SGLang's
        while w.rid in rids:
            w.rid = f"{w.rid}x"
        rids.add(w.rid)

    cached: list[CachedSeq] = []
    private_rids: dict[int, str] = {}
    everyone = first + second
    for w in rng.sample(everyone, k=min(len(everyone), rng.randint(0, len(everyone)))):
        full = w.prompt_tokens
        tokens = (full if rng.random() < 0.3 else rng.randint(1, full)) // page * page
        if tokens <= 0:
            continue
        if w.hash_ids is None:
            cached.append(CachedSeq(None, w.uid, tokens))
            private_rids[w.uid] = w.rid
        else:
            cached.append(CachedSeq(w.hash_ids, None, tokens))
    for _ in range(rng.randint(0, 3)):  # unrelated cache
        hashes = (
            tuple(rng.choice(paths)[: rng.randint(1, 4)]) if rng.random() < 0.5 else tuple(fresh(3))
        )
        tokens = rng.randint(1, len(hashes) * block) // page * page
        if tokens:
            cached.append(CachedSeq(hashes, None, tokens))
    rng.shuffle(cached)
    device = []
    for k, c in enumerate(cached):
        r = rng.random()
        if r < 0.45:
            device.append((k, c.tokens))
        elif r < 0.75:
            kept = rng.randint(0, c.tokens) // page * page
            if kept:
                device.append((k, kept))
    passes = [(first, processed)]
    if second or rng.random() < 0.5:
        passes.append((second, processed + rng.randint(0, 3000)))
    return OrderScenario(
        f"seed {seed} {policy} page {page} block {block} n {n1}+{len(second)}",
        policy, page, block, check, dep, priority_on, low_first, seed, cached, device, passes,
        private_rids,
    )  # fmt: skip


# -- preemption ----------------------------------------------------------------------------


@dataclass
class RunSpec:
    priority: int
    queue_entry: float
    max_new_tokens: int
    output_tokens: int
    ignore_eos: bool
    finished: bool


@dataclass
class PreemptScenario:
    label: str
    low_first: bool
    threshold: int
    ratio: float
    available_tokens: int
    page_size: int
    running: list[RunSpec]
    candidate: WaitSpec
    candidate_state: str  # fresh | examined | retracted
    candidate_cached: int  # device tokens of the candidate's prompt in the cache


def random_preempt_scenario(seed: int) -> PreemptScenario:
    rng = random.Random(seed * 104729 + 3)
    low_first = rng.random() < 0.5
    threshold = rng.choice([10, 10, 0, 1, 3, -1, 25])
    ratio = rng.choice([0.7, 0.4, 1.0, 0.123, 0.9999])
    page = rng.choice([1, 1, 4])
    cand_priority = rng.choice([0, 5, 11, 15, 21, 40, 101, -20])
    edge = [cand_priority + d * threshold * (1 if low_first else -1) for d in (1, 2)]
    running = []
    small = rng.random() < 0.5  # many small reservations: several victims needed
    for _ in range(rng.randint(0, 12)):
        if small:
            mx = rng.choice([4, 16, 40, 100, rng.randint(1, 300)])
        else:
            mx = rng.choice([8, 64, 300, 2000, 4096, 6000, rng.randint(1, 9000)])
        running.append(
            RunSpec(
                rng.choice([0, 0, 1, 5, 12, 20, 30, -15, 100, *edge]),  # edge: diff == threshold
                float(rng.choice([1, 2, 3, 4, 7]) + rng.randint(0, 2)),
                mx, rng.randint(0, mx + 3), rng.random() < 0.2, rng.random() < 0.12,
            )
        )  # fmt: skip
    prompt = rng.choice([rng.randint(1, 600), rng.randint(1, 4000)])
    cand = WaitSpec(
        10_000, "cand", None, prompt, rng.choice([0, 0, rng.randint(1, 40)]),
        rng.choice([1, 50, 500, 4096, 7000, rng.randint(1, 9000)]),
        cand_priority, 0.0, 0,
    )  # fmt: skip
    state = rng.choice(["fresh", "fresh", "examined", "retracted"])
    cached = rng.randint(0, prompt) // page * page if rng.random() < 0.6 else 0
    available = rng.choice([0, 0, 64, 512, 4096, 20000, rng.randint(0, 30000)])
    if rng.random() < 0.5:  # near the edge: some but not all of the running headroom needed
        reserved = sum(min(r.max_new_tokens - r.output_tokens, 4096) for r in running)
        own = min(cand.max_new_tokens, 4096) + (0 if state == "fresh" else prompt)
        available = max(0, own + rng.randint(-50, max(0, int(reserved * ratio * 0.9))))
    available = available // page * page
    return PreemptScenario(
        f"preempt seed {seed}", low_first, threshold, ratio, available, page, running, cand,
        state, cached,
    )  # fmt: skip
