"""Seed 004's conservative and optimistic policies against a physical block-pool reference.

The reference restates the seed's description with explicit block ids: a free pool of
``capacity`` ids, each request owning a list of ids, a token needing a new block when
its request's blocks hold fewer slots than its tokens, and victims returning every id
to the pool. The implementation counts blocks arithmetically instead.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.core.errors import ConfigError, InputError
from cpkv.policies.blocks import BlockRequest, KvBlocks, conservative
from cpkv.policies.growth import optimistic

SEED_REQUESTS = [BlockRequest("A", 6, 6), BlockRequest("B", 4, 4)]
SEED_KV = KvBlocks(block_size=4, capacity_blocks=4)


class Overflow(Exception):
    """The seed's assert: the requests' prompt blocks do not all fit."""


def blocks_walk(tokens: int, block: int) -> int:
    """Blocks for ``tokens`` tokens, counted by walking the tokens."""
    return sum(1 for t in range(tokens) if t % block == 0)


def reference_admit(reqs, capacity, block, need_of, scan):
    """Give each request its blocks from a pool of ids, in order, by ``scan``."""
    pool = list(range(capacity))
    owned: dict[str, list[int]] = {}
    for r in reqs:
        need = need_of(r, block)
        if len(pool) >= need:
            owned[r.rid] = [pool.pop() for _ in range(need)]
        elif scan == "all_or_error":
            raise Overflow
        elif scan == "fcfs_stop":
            break
    return pool, owned


def reserve_need(r, block):
    return blocks_walk(r.prompt_tokens + r.max_new_tokens, block)


def prompt_need(r, block):
    return blocks_walk(r.prompt_tokens, block)


def pick_victim(order, running, grower, owned, tokens):
    """Victim orders restated: a list in admission order, sorted / scanned differently."""
    if order == "scan_order":
        return grower
    if order == "newest_first":
        return running[-1]
    if order == "largest_first":

        def size(r):
            return len(owned[r.rid])

        best = running[-1]
        for r in reversed(running):
            if size(r) > size(best):
                best = r
        return best
    # least_progress: SGLang sorts (generated, -prompt) descending, stable, and pops the last
    ranked = sorted(
        running, key=lambda r: (tokens[r.rid] - r.prompt_tokens, -r.prompt_tokens), reverse=True
    )
    return ranked[-1]


def reference_optimistic(
    reqs, capacity, block, scan="all_or_error", victim="scan_order", on_finish="keep"
):
    pool, owned = reference_admit(reqs, capacity, block, prompt_need, scan)
    running = [r for r in reqs if r.rid in owned]
    admitted = [r.rid for r in running]
    tokens = {r.rid: r.prompt_tokens for r in running}
    events = []
    for step in range(max((r.max_new_tokens for r in running), default=0)):
        for r in list(running):
            if r not in running:
                continue
            if step >= r.max_new_tokens:
                running.remove(r)
                if on_finish == "free":
                    pool += owned.pop(r.rid)
                    events.append((step, r.rid, "finished", capacity - len(pool)))
                continue
            if len(owned[r.rid]) * block > tokens[r.rid]:  # a free slot in its last block
                tokens[r.rid] += 1
                events.append((step, r.rid, "advanced", capacity - len(pool)))
                continue
            # the next token needs a new block: free victims' blocks until one is in the pool
            while not pool and r in running:
                v = pick_victim(victim, running, r, owned, tokens)
                running.remove(v)
                pool += owned.pop(v.rid)
                events.append((step, v.rid, "preempted", capacity - len(pool)))
            if r in running:
                tokens[r.rid] += 1
                owned[r.rid].append(pool.pop())
                events.append((step, r.rid, "advanced", capacity - len(pool)))
    return admitted, events


def event_tuples(outcome):
    return [(e.step, e.rid, e.event, e.used_blocks) for e in outcome.events]


# -- the seed's worked examples, derived by hand ------------------------------------------


def test_seed_conservative_admits_a_with_three_blocks() -> None:
    out = conservative(SEED_REQUESTS, SEED_KV)
    assert out.admitted == ("A",)
    assert out.reserved_blocks == 3
    assert [(d.rid, d.need_blocks, d.reason) for d in out.decisions] == [
        ("A", 3, "admitted"),
        ("B", 2, "no_room"),
    ]


def test_seed_optimistic_preempts_a_at_step_2_leaving_2_blocks() -> None:
    out = optimistic(SEED_REQUESTS, SEED_KV)
    assert out.admitted == ("A", "B")
    assert out.reserved_blocks == 3  # 2 + 1 prompt blocks
    assert event_tuples(out) == [
        (0, "A", "advanced", 3),  # A 7 tokens, still 2 blocks
        (0, "B", "advanced", 4),  # B 5 tokens -> 2 blocks
        (1, "A", "advanced", 4),
        (1, "B", "advanced", 4),
        (2, "A", "preempted", 2),  # A's 9th token needs a 3rd block: 5 > 4, A frees 3
        (2, "B", "advanced", 2),
        (3, "B", "advanced", 2),  # B reaches 8 tokens; step 4 it finishes silently
    ]
    assert (out.final_used_blocks, out.peak_used_blocks) == (2, 4)


def test_newest_first_preempts_b_and_lets_a_finish() -> None:
    out = optimistic(SEED_REQUESTS, KvBlocks(4, 4, victim="newest_first"))
    assert event_tuples(out)[4:] == [
        (2, "B", "preempted", 2),  # A's 9th token needs a 3rd block: B frees its 2
        (2, "A", "advanced", 3),
        (3, "A", "advanced", 3),
        (4, "A", "advanced", 3),
        (5, "A", "advanced", 3),
    ]


def test_finished_requests_keep_their_blocks_unless_on_finish_free() -> None:
    reqs = [BlockRequest("A", 4, 0), BlockRequest("B", 3, 2)]
    keep = optimistic(reqs, KvBlocks(4, 2))
    assert event_tuples(keep) == [(0, "B", "advanced", 2), (1, "B", "preempted", 1)]
    free = optimistic(reqs, KvBlocks(4, 2, on_finish="free"))
    assert event_tuples(free) == [
        (0, "A", "finished", 1),
        (0, "B", "advanced", 1),
        (1, "B", "advanced", 2),
    ]


def test_first_fit_passes_a_request_that_fcfs_stop_waits_on() -> None:
    reqs = [*SEED_REQUESTS, BlockRequest("C", 2, 2)]  # needs 3, 2, 1 of 4
    assert conservative(reqs, SEED_KV).admitted == ("A", "C")
    stop = conservative(reqs, KvBlocks(4, 4, scan="fcfs_stop"))
    assert stop.admitted == ("A",)
    assert [d.reason for d in stop.decisions] == ["admitted", "no_room", "after_stop"]


# -- errors ---------------------------------------------------------------------------------


def test_seed_optimistic_scan_refuses_prompts_beyond_capacity() -> None:
    with pytest.raises(ConfigError, match="admit.kv.capacity_blocks.*first_fit"):
        optimistic(SEED_REQUESTS, KvBlocks(4, 2))
    assert optimistic(SEED_REQUESTS, KvBlocks(4, 2, scan="first_fit")).admitted == ("A",)


@pytest.mark.parametrize(
    ("kv", "key"),
    [
        (KvBlocks(block_size=0), "admit.kv.block_size"),
        (KvBlocks(capacity_blocks=-1), "admit.kv.capacity_blocks"),
        (KvBlocks(scan="best_fit"), "admit.kv.scan.*first_fit"),
        (KvBlocks(victim="oldest"), "admit.kv.victim.*newest_first"),
    ],
)
def test_bad_kv_blocks_name_the_key(kv: KvBlocks, key: str) -> None:
    for policy in (conservative, optimistic):
        with pytest.raises(ConfigError, match=key):
            policy(SEED_REQUESTS, kv)


def test_bad_requests_are_input_errors() -> None:
    with pytest.raises(InputError, match="twice"):
        conservative([BlockRequest("A", 1, 1), BlockRequest("A", 2, 2)], SEED_KV)
    with pytest.raises(InputError, match=">= 0"):
        optimistic([BlockRequest("A", -1, 1)], SEED_KV)


# -- randomized comparison with the reference ---------------------------------------------

request_lists = st.lists(
    st.tuples(st.integers(0, 20), st.integers(0, 12)), min_size=0, max_size=6
).map(lambda rows: [BlockRequest(f"r{i}", p, m) for i, (p, m) in enumerate(rows)])


block_sizes = st.integers(1, 6)
capacities = st.integers(0, 16)
scans = st.sampled_from(["first_fit", "fcfs_stop"])


@settings(max_examples=400, deadline=None)
@given(reqs=request_lists, block=block_sizes, capacity=capacities, scan=scans)
def test_conservative_matches_reference(reqs, block, capacity, scan) -> None:
    pool, owned = reference_admit(reqs, capacity, block, reserve_need, scan)
    out = conservative(reqs, KvBlocks(block, capacity, scan=None if scan == "first_fit" else scan))
    assert list(out.admitted) == list(owned)
    assert out.reserved_blocks == capacity - len(pool)


@settings(max_examples=400, deadline=None)
@given(reqs=request_lists, block=block_sizes, data=st.data())
def test_seed_optimistic_matches_reference(reqs, block, data) -> None:
    prompt_blocks = sum(blocks_walk(r.prompt_tokens, block) for r in reqs)
    capacity = data.draw(st.integers(max(prompt_blocks - 2, 0), prompt_blocks + 6))
    try:
        admitted, events = reference_optimistic(reqs, capacity, block)
    except Overflow:
        with pytest.raises(ConfigError, match="capacity_blocks"):
            optimistic(reqs, KvBlocks(block, capacity))
        return
    out = optimistic(reqs, KvBlocks(block, capacity))
    assert list(out.admitted) == admitted
    assert out.reserved_blocks == prompt_blocks
    assert event_tuples(out) == events


@settings(max_examples=400, deadline=None)
@given(
    reqs=request_lists,
    block=block_sizes,
    capacity=capacities,
    scan=scans,
    victim=st.sampled_from(["scan_order", "newest_first", "largest_first", "least_progress"]),
    on_finish=st.sampled_from(["keep", "free"]),
)
def test_optimistic_options_match_reference(reqs, block, capacity, scan, victim, on_finish) -> None:
    admitted, events = reference_optimistic(reqs, capacity, block, scan, victim, on_finish)
    out = optimistic(reqs, KvBlocks(block, capacity, scan=scan, victim=victim, on_finish=on_finish))
    assert list(out.admitted) == admitted
    assert event_tuples(out) == events
    assert all(e.used_blocks <= capacity for e in out.events)
    assert out.peak_used_blocks <= capacity
