"""Impl ``fast`` against the reference on the seed's bench cases (scaled down), after every
operation: stats, free-room stats, selections, allocations, frees, None and lane state.
The CUDA tests run the same comparison on a GPU and check that alloc never synchronises."""

from __future__ import annotations

import random

import pytest
import torch

from cpkv.alloc.l1.fast import FastL1Allocator
from cpkv.alloc.l1.fast_torch import TorchFastL1Allocator
from cpkv.alloc.l1.layouts import FREE_PATTERNS, OWNER_PATTERNS, make_free_pages, make_page_owners
from cpkv.alloc.l1.reference import ReferenceL1Allocator, make_l1_allocator

PHYSICAL, CP, PAGE = 96, 8, 4


def as_list(value):
    return None if value is None else value.tolist()


def replay(allocs, owners, rng):
    """One scripted workload on several allocators at once; every answer must agree."""

    def same(call):
        answers = []
        for alloc in allocs:
            try:
                answers.append(call(alloc))
            except ValueError:
                answers.append("ValueError")
        assert all(a == answers[0] for a in answers), answers
        return answers[0]

    def same_state():
        same(lambda a: a.lanes())
        for alloc in allocs:
            alloc.check_integrity()

    room = {"target_ratio": 0.15, "trigger_ratio": 0.05}
    same(lambda a: a.compute_owner_lane_stats(owners))
    same(lambda a: a.compute_owner_lane_free_room_stats(owners, **room))
    same(lambda a: as_list(a.select_token_indices(owners)))
    held = []
    for _ in range(3):  # consecutive allocations of the bench request
        held.append(same(lambda a: as_list(a.alloc_pages_with_owners(owners))))
        same_state()
    mixed = [rng.randrange(CP) for _ in range(rng.randrange(1, 40))]
    held.append(same(lambda a: as_list(a.alloc_pages_with_owners(mixed))))
    same_state()
    for tokens in held:  # free everything back, in a shuffled page order
        if not tokens:
            continue
        pages = [tokens[i : i + PAGE] for i in range(0, len(tokens), PAGE)]
        rng.shuffle(pages)
        flat = torch.tensor([t for page in pages for t in page])
        same(lambda a, flat=flat: a.free(flat))
        same_state()
    for _ in range(4):  # now release lists are in play, and the pool runs dry
        big = owners * rng.randrange(1, 6)
        same(lambda a, big=big: as_list(a.alloc_pages_with_owners(big)))
        same_state()
    same(lambda a: as_list(a.alloc_pages_with_owners([0, CP])))  # ValueError everywhere


@pytest.mark.parametrize("selector", ["fifo", "current"])
@pytest.mark.parametrize("order", ["sorted", "as_given"])
@pytest.mark.parametrize("free_pattern", FREE_PATTERNS)
def test_fast_equals_reference_on_bench_cases(selector, order, free_pattern):
    rng = random.Random(f"{selector}-{order}-{free_pattern}")
    for owner_pattern in OWNER_PATTERNS:
        for request in (8, 64, 150):
            owners = make_page_owners(owner_pattern, request, CP)
            free = make_free_pages(
                free_pattern, physical_pages=PHYSICAL, cp_size=CP, request_owners=owners, seed=0
            )
            allocs = [
                cls(
                    physical_pages=PHYSICAL,
                    page_size=PAGE,
                    cp_size=CP,
                    selector=selector,
                    lane_order=order,
                    device="cpu",
                    free_pages=free,
                )
                for cls in (ReferenceL1Allocator, FastL1Allocator, TorchFastL1Allocator)
            ]
            replay(allocs, owners, rng)


@pytest.mark.parametrize("cls", [ReferenceL1Allocator, FastL1Allocator, TorchFastL1Allocator])
@pytest.mark.parametrize("order", ["sorted", "as_given"])
@pytest.mark.parametrize("copy", [True, False])
def test_snapshot_restore_gives_back_the_same_state(cls, order, copy):
    alloc = cls(
        physical_pages=16,
        page_size=2,
        cp_size=4,
        selector="contiguous",
        lane_order=order,
        device="cpu",
    )
    held = alloc.alloc_pages_with_owners([0, 1, 1, 3, 2, 2])
    alloc.free(held[8:])  # positions 4 and 5: lane 2's two pages into its release list
    snap = alloc.snapshot()
    before = alloc.lanes()
    for _ in range(3):  # a snapshot can be restored again and again, shared or copied
        out = alloc.alloc_pages_with_owners([1] * 14 + [2] * 3)
        alloc.free(out)
        alloc.free(held[:2])
        alloc.restore(snap, copy=copy)
        assert alloc.lanes() == before
        alloc.check_integrity()
    assert alloc.compute_owner_lane_stats([1])[1] == [16 - 1, 16 - 2, 16, 16 - 1]
    assert len(before.release[2]) == 2


def test_fast_owner_counting_paths_agree():
    # cp > 256 takes the numpy counting path; lists, tuples and arrays are all accepted
    alloc = FastL1Allocator(physical_pages=2, page_size=1, cp_size=300)
    reference = ReferenceL1Allocator(physical_pages=2, page_size=1, cp_size=300)
    owners = [299, 0, 299, 5]
    assert alloc.compute_owner_lane_stats(owners) == reference.compute_owner_lane_stats(owners)
    assert as_list(alloc.alloc_pages_with_owners(tuple(owners))) == as_list(
        reference.alloc_pages_with_owners(owners)
    )
    small = FastL1Allocator(physical_pages=2, page_size=1, cp_size=4)
    assert small.compute_owner_lane_stats(torch.tensor([3, 3, 0]))[0] == [1, 0, 0, 2]
    with pytest.raises(ValueError, match="got 300"):
        alloc.select([1, 300])


@pytest.mark.cuda
@pytest.mark.parametrize("selector", ["fifo", "contiguous"])
@pytest.mark.parametrize("order", ["sorted", "as_given"])
def test_cuda_fast_and_reference_equal_the_cpu_answers(selector, order):
    rng = random.Random(7)
    for free_pattern in FREE_PATTERNS:
        owners = make_page_owners("zigzag", 64, CP)
        free = make_free_pages(
            free_pattern, physical_pages=PHYSICAL, cp_size=CP, request_owners=owners, seed=0
        )
        kwargs = {
            "physical_pages": PHYSICAL,
            "page_size": PAGE,
            "cp_size": CP,
            "selector": selector,
            "lane_order": order,
            "free_pages": free,
        }
        allocs = [
            make_l1_allocator("fast", device="cuda", **kwargs),
            make_l1_allocator("reference", device="cuda", **kwargs),
            make_l1_allocator("fast", device="cpu", **kwargs),
        ]
        assert isinstance(allocs[0], TorchFastL1Allocator)
        replay(allocs, owners, rng)


@pytest.mark.cuda
@pytest.mark.parametrize("selector", ["fifo", "contiguous"])
@pytest.mark.parametrize("order", ["sorted", "as_given"])
def test_cuda_fast_alloc_never_synchronises(selector, order):
    free = make_free_pages("random", physical_pages=4096, cp_size=CP, request_owners=[0], seed=0)
    alloc = make_l1_allocator(
        "fast",
        physical_pages=4096,
        page_size=64,
        cp_size=CP,
        selector=selector,
        lane_order=order,
        device="cuda",
        free_pages=free,
    )
    outputs = []
    for owner_pattern in OWNER_PATTERNS:  # warm the pinned-memory cache first
        alloc.alloc_pages_with_owners(make_page_owners(owner_pattern, 64, CP))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for owner_pattern in OWNER_PATTERNS:
            for request in (8, 64, 512):
                owners = make_page_owners(owner_pattern, request, CP)
                outputs.append(alloc.alloc_pages_with_owners(owners))
                alloc.compute_owner_lane_stats(owners)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(out is not None and out.is_cuda for out in outputs)
    alloc.check_integrity()


@pytest.mark.parametrize("order", ["sorted", "as_given"])
@pytest.mark.parametrize(
    "owners",
    [
        [0, 1, 0, 1, 0, 1],  # fresh lanes, round robin: logical pages 1..6, consecutive
        [0, 0, 1, 1],  # pages 1, 3, 2, 4: the ends are n - 1 apart, the middle is not
        [1, 0, 1, 0],  # pages 2, 1, 4, 3
        [1, 1, 1],  # one lane: pages 2, 4, 6 step by cp_size
        [0, 1],
    ],
)
def test_fast_tokens_of_page_progressions_are_whole_pages(order, owners) -> None:
    """The template shortcuts (consecutive pages, one-lane runs) against the definition."""
    ps = 4
    fast = FastL1Allocator(physical_pages=8, page_size=ps, cp_size=2, lane_order=order)
    ref = ReferenceL1Allocator(physical_pages=8, page_size=ps, cp_size=2, lane_order=order)
    for _ in range(2):  # the second time from partly used lanes
        pages = ref.select(owners).tolist()
        want = [p * ps + o for p in pages for o in range(ps)]
        assert fast.select_token_indices(owners).tolist() == want
        assert fast.alloc_pages_with_owners(owners).tolist() == want
        assert ref.alloc_pages_with_owners(owners).tolist() == want


def test_remembered_owner_layouts_follow_the_values_not_the_list() -> None:
    """Owner patterns are remembered by value: a list changed in place is counted anew, a
    caller that edits the stats it got back changes nothing, and a full table empties."""
    fast = FastL1Allocator(physical_pages=64, page_size=1, cp_size=4)
    ref = ReferenceL1Allocator(physical_pages=64, page_size=1, cp_size=4)
    owners = [i % 4 for i in range(40)]
    for _ in range(2):
        required = fast.compute_owner_lane_stats(owners)[0]
        assert required == ref.compute_owner_lane_stats(owners)[0] == [10, 10, 10, 10]
        required[0] = 99  # the caller's copy
    owners[:8] = [3] * 8  # the same list object, other values
    assert fast.compute_owner_lane_stats(owners) == ref.compute_owner_lane_stats(owners)
    assert fast.select(owners).tolist() == ref.select(owners).tolist()
    counter = fast._owners
    for n in range(counter.KEEP + 5):  # more patterns than the table keeps
        pattern = [(i * 7 + n) % 4 for i in range(33 + n % 50)]
        assert fast.select(pattern).tolist() == ref.select(pattern).tolist()
    assert 0 < len(counter._layouts) <= counter.KEEP


@pytest.mark.parametrize("cls", [ReferenceL1Allocator, FastL1Allocator])
@pytest.mark.parametrize("physical", [4, 4096])  # short and long lists against the pool
def test_repeated_pages_are_refused_and_change_nothing(cls, physical) -> None:
    with pytest.raises(ValueError, match="repeat"):
        cls(physical_pages=physical, page_size=2, cp_size=2, free_pages=[1, 2, 3, 2])
    alloc = cls(physical_pages=physical, page_size=2, cp_size=2)
    tokens = alloc.alloc_pages_with_owners([0, 1, 0, 1])
    before = alloc.lanes()
    twice = torch.cat([tokens[:2], tokens[:2]])  # the first page given back twice
    with pytest.raises(ValueError, match="more than once"):
        alloc.free(twice)
    assert alloc.lanes() == before
    alloc.free(tokens)
    alloc.check_integrity()
