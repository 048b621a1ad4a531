"""The reference host allocator against an independent brute-force model of seed 003's rule."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.alloc.host.layouts import page_order, pages_to_slots
from cpkv.alloc.host.reference import HostAllocator
from tests.helpers.host_model import brute_force


def _run(free: list[int], ops: list[tuple[str, int]], ps: int) -> None:
    alloc = HostAllocator(ps, torch.tensor(free, dtype=torch.int64))
    model = list(free)
    held: list[list[int]] = []
    for kind, pages in ops:
        n = pages * ps
        if kind == "free":
            if not held:
                continue
            block = held.pop(0)
            alloc.free(torch.tensor(block, dtype=torch.int64))
            model = model + block
        else:
            got = alloc.alloc_contiguous_preferred(n) if kind == "contig" else alloc.alloc(n)
            want, model = brute_force(model, n, ps, kind == "contig")
            assert (got.tolist() if got is not None else None) == want
            if want:
                held.append(want)
        assert alloc.free_slot_list() == model


@settings(max_examples=150, deadline=None)
@given(
    pages=st.integers(1, 24),
    ps=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 10_000),
    ops=st.lists(
        st.tuples(st.sampled_from(["fifo", "contig", "contig", "free"]), st.integers(1, 6)),
        max_size=12,
    ),
)
def test_random_sequences_match_brute_force(pages: int, ps: int, seed: int, ops: list) -> None:
    rng = random.Random(seed)
    order = list(range(pages))
    rng.shuffle(order)
    free = [p * ps + o for p in order for o in range(ps)]
    _run(free, ops, ps)


@settings(max_examples=100, deadline=None)
@given(
    slots=st.permutations(list(range(24))), n_pages=st.integers(1, 6), ps=st.sampled_from([2, 3, 4])
)
def test_arbitrary_slot_orders_match_brute_force(slots: list[int], n_pages: int, ps: int) -> None:
    """Free lists that are not made of whole pages exercise the intact-chunk test."""
    n = n_pages * ps
    alloc = HostAllocator(ps, torch.tensor(slots, dtype=torch.int64))
    got = alloc.alloc_contiguous_preferred(n)
    want, rest = brute_force(slots, n, ps, True)
    assert (got.tolist() if got is not None else None) == want
    assert alloc.free_slot_list() == rest


def test_fragmented_layout_by_hand() -> None:
    # 10 pages, request 2: the run starts at max(1, 10 // 3) = 3 -> pages 3, 4;
    # the scattered prefix walks down from 9 two at a time: 9, 7; the rest ascends.
    assert page_order(10, 2, "fragmented_prefix_later_run", 0) == [9, 7, 3, 4, 0, 1, 2, 5, 6, 8]


def test_fragmented_layout_small_pool_exact() -> None:
    # total 6, need 4: run = [2, 3, 4, 5]; scattered from 5 (in run), 3 (in run), 1, then 4, 2 (in run), 0
    assert page_order(6, 4, "fragmented_prefix_later_run", 0) == [1, 0, 2, 3, 4, 5]


def test_layouts_are_permutations_and_seeded() -> None:
    for pattern in ("contiguous_fifo", "fragmented_prefix_later_run", "random_fragmented"):
        order = page_order(1000, 64, pattern, 7)
        assert sorted(order) == list(range(1000))
    gen = torch.Generator().manual_seed(7)
    assert (
        page_order(1000, 8, "random_fragmented", 7) == torch.randperm(1000, generator=gen).tolist()
    )
    assert page_order(1000, 8, "random_fragmented", 8) != page_order(
        1000, 8, "random_fragmented", 7
    )


@pytest.mark.parametrize("req", [2, 8, 64])
def test_contiguous_finds_the_later_run_fifo_does_not(req: int) -> None:
    total, ps = 3000, 4
    slots = pages_to_slots(page_order(total, req, "fragmented_prefix_later_run", 0), ps)
    # every page is free, so the lowest-addressed run of `req` whole pages is pages 0..req-1
    # (they sit in the tail of the free list, behind the scattered prefix and the run)
    got = HostAllocator(ps, slots.clone()).alloc_contiguous_preferred(req * ps)
    assert got.tolist() == list(range(0, req * ps))
    fifo = HostAllocator(ps, slots.clone()).alloc(req * ps).view(-1, ps)[:, 0] // ps
    assert not bool((fifo[1:] - fifo[:-1] == 1).all())


def test_alloc_rejects_partial_pages_and_returns_none_when_short() -> None:
    alloc = HostAllocator(4, torch.arange(16))
    with pytest.raises(ValueError):
        alloc.alloc(3)
    assert alloc.alloc(20) is None
    assert alloc.alloc_contiguous_preferred(20) is None
    assert alloc.alloc(16).tolist() == list(range(16))
    assert alloc.available_size() == 0
