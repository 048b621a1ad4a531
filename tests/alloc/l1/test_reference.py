"""Hand-derived examples of the L1 allocator's rules, run on every implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpkv.alloc.l1.fast import FastL1Allocator
from cpkv.alloc.l1.fast_torch import TorchFastL1Allocator
from cpkv.alloc.l1.reference import (
    ReferenceL1Allocator,
    is_selection_contiguous,
    make_l1_allocator,
    resolve_device,
)
from cpkv.core.errors import ConfigError, UnsupportedError

IMPLS = [ReferenceL1Allocator, FastL1Allocator, TorchFastL1Allocator]


def make(cls, physical, cp, ps=1, selector="fifo", order="sorted", free=None):
    pages = None if free is None else torch.tensor(free, dtype=torch.int64)
    return cls(
        physical_pages=physical,
        page_size=ps,
        cp_size=cp,
        selector=selector,
        lane_order=order,
        device="cpu",
        free_pages=pages,
    )


def tokens(alloc, owners):
    out = alloc.alloc_pages_with_owners(owners)
    alloc.check_integrity()
    return None if out is None else out.tolist()


@pytest.mark.parametrize("cls", IMPLS)
def test_pages_lanes_and_token_indices(cls):
    # 4 physical pages, cp 2: lane 0 = 1,3,5,7 and lane 1 = 2,4,6,8; page_size 2.
    alloc = make(cls, 4, 2, ps=2)
    assert alloc.lanes().free == ((1, 3, 5, 7), (2, 4, 6, 8))
    # owners [0, 1, 1]: position 0 <- lane 0's page 1; positions 1, 2 <- lane 1's pages 2, 4
    assert tokens(alloc, [0, 1, 1]) == [2, 3, 4, 5, 8, 9]
    assert alloc.lanes().free == ((3, 5, 7), (6, 8))
    assert alloc.compute_owner_lane_stats([0, 0, 1]) == ([2, 1], [3, 2], [0, 0])
    assert alloc.compute_owner_lane_stats([1, 1, 1]) == ([0, 3], [3, 2], [0, 1])
    assert alloc.select([]).tolist() == [] and tokens(alloc, []) == []


@pytest.mark.parametrize("cls", IMPLS)
def test_contiguous_takes_the_lowest_run_when_the_prefix_is_broken(cls):
    free = [7, 5, 2, 3, 4, 1]  # cp 1: page p is physical page p
    fifo = make(cls, 8, 1, selector="fifo", order="as_given", free=free)
    contiguous = make(cls, 8, 1, selector="current", order="as_given", free=free)
    assert tokens(fifo, [0, 0, 0]) == [7, 5, 2]
    assert tokens(contiguous, [0, 0, 0]) == [1, 2, 3]  # runs 1-2-3, 2-3-4, 3-4-5: lowest
    assert contiguous.lanes().free == ((7, 5, 4),)
    # sorted lanes: the prefix 1, 2, 3 is already consecutive
    assert tokens(make(cls, 8, 1, selector="fifo", free=free), [0, 0, 0]) == [1, 2, 3]


@pytest.mark.parametrize("cls", IMPLS)
def test_contiguous_keeps_a_consecutive_prefix_and_falls_back_to_it(cls):
    above = make(cls, 8, 1, selector="contiguous", order="as_given", free=[5, 6, 1, 2])
    assert tokens(above, [0, 0]) == [5, 6]  # consecutive prefix wins over the lower run 1-2
    no_run = make(cls, 8, 1, selector="contiguous", order="as_given", free=[1, 3, 5, 7])
    assert tokens(no_run, [0, 0]) == [1, 3]  # no run of 2: the prefix
    # cp 2, lane 1 = pages 2, 4, 6, ...: physical ordinals matter, not page numbers
    lanes = make(cls, 8, 2, selector="contiguous", order="as_given", free=[2, 8, 10, 12, 4])
    assert tokens(lanes, [1, 1, 1]) == [8, 10, 12]
    sorted_lane = make(cls, 8, 2, selector="contiguous", free=[2, 6, 10, 12, 16])
    assert tokens(sorted_lane, [1, 1]) == [10, 12]  # 2,6 broken; 10,12 the first run


@pytest.mark.parametrize("cls", IMPLS)
@pytest.mark.parametrize("order", ["sorted", "as_given"])
def test_free_goes_to_release_and_is_used_after_the_free_list(cls, order):
    alloc = make(cls, 4, 1, order=order)
    assert tokens(alloc, [0, 0, 0]) == [1, 2, 3]
    alloc.free(torch.tensor([3]))
    alloc.free(np.array([1]))
    alloc.check_integrity()
    expected_release = (1, 3) if order == "sorted" else (3, 1)
    assert alloc.lanes().release == (expected_release,)
    assert alloc.compute_owner_lane_stats([0])[1] == [3]
    before = alloc.lanes()
    assert tokens(alloc, [0, 0, 0, 0]) is None  # 3 available: nothing changes
    assert alloc.lanes() == before
    assert tokens(alloc, [0, 0]) == [4, expected_release[0]]  # free page 4, then release
    assert alloc.lanes().release == ((expected_release[1],),)


@pytest.mark.parametrize("cls", IMPLS)
def test_bad_owners_are_value_errors_before_anything_else(cls):
    alloc = make(cls, 2, 2)
    for owners in ([0, 2], [-1], [0, 0, 0, 0, 0, 300], [1] * 30 + [-5]):
        with pytest.raises(ValueError, match=r"compute owner must be in \[0, 2\), got"):
            alloc.select(owners)
        with pytest.raises(ValueError, match="compute owner"):
            alloc.alloc_pages_with_owners(owners)
        with pytest.raises(ValueError, match="compute owner"):
            alloc.compute_owner_lane_stats(owners)
    with pytest.raises(ValueError, match="got 2"):  # the first bad owner is named
        alloc.select([0, 2, 3])
    assert alloc.lanes().free == ((1, 3), (2, 4))


@pytest.mark.parametrize("cls", IMPLS)
def test_free_room_deficits(cls):
    # capacity 40 pages per lane; target 0.25 -> 10 pages of room, trigger 0.125 -> 5.
    alloc = make(cls, 40, 1)
    room = {"target_ratio": 0.25, "trigger_ratio": 0.125}
    assert alloc.compute_owner_lane_free_room_stats([0] * 35, **room)[2] == [0]  # 40 >= 35 + 5
    assert alloc.compute_owner_lane_free_room_stats([0] * 36, **room)[2] == [6]  # 36 + 10 - 40
    assert alloc.compute_owner_lane_free_room_stats([0] * 45, **room) == ([45], [40], [15])
    none = {"target_ratio": 0.0, "trigger_ratio": 0.0}
    assert alloc.compute_owner_lane_free_room_stats([0] * 41, **none)[2] == [1]


@pytest.mark.parametrize("cls", IMPLS)
def test_bad_frees_are_value_errors_and_change_nothing(cls):
    alloc = make(cls, 4, 1, ps=2)
    held = tokens(alloc, [0, 0])  # pages 1, 2 -> tokens 2..5
    before = alloc.lanes()
    for bad in ([2, 3, 2, 3], [3, 4], [2], [6, 7], [0, 1], [2.0, 3.0], [20, 21]):
        with pytest.raises(ValueError, match="free"):
            alloc.free(torch.tensor(bad))
    assert alloc.lanes() == before
    alloc.free(torch.tensor(held[:2]))
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free(torch.tensor(held[:2]))
    alloc.check_integrity()


@pytest.mark.parametrize("cls", IMPLS)
def test_free_accepts_lists_and_nothing(cls):
    alloc = make(cls, 4, 2, ps=2)
    held = tokens(alloc, [1, 0])  # lane 1's page 2 -> tokens 4, 5; lane 0's page 1 -> 2, 3
    assert held == [4, 5, 2, 3]
    before = alloc.lanes()
    alloc.free([])
    alloc.free(torch.empty(0, dtype=torch.int64))
    assert alloc.lanes() == before
    alloc.free(held)  # a plain list of token indices
    assert alloc.lanes().release == ((1,), (2,))
    alloc.check_integrity()


@pytest.mark.parametrize("cls", IMPLS)
def test_check_integrity_catches_a_page_both_free_and_allocated(cls):
    alloc = make(cls, 4, 2, ps=1)
    tokens(alloc, [0])  # page 1 allocated
    snapshot = alloc.snapshot()
    free, release, allocated = snapshot
    if isinstance(allocated, np.ndarray):
        allocated = allocated.copy()
        allocated[3] = True  # page 3 is still in lane 0's free list
    else:
        allocated = allocated.clone()
        allocated[3] = True
    alloc.restore((free, release, allocated))
    with pytest.raises(AssertionError, match="both free and allocated"):
        alloc.check_integrity()
    alloc.restore(snapshot)
    alloc.check_integrity()


@pytest.mark.parametrize("cls", IMPLS)
def test_check_integrity_catches_wrong_lanes_and_lost_pages(cls):
    alloc = make(cls, 4, 2)
    free, release, allocated = alloc.snapshot()
    wrong = (free[1], free[0])  # lanes swapped
    alloc.restore((wrong, release, allocated))
    with pytest.raises(AssertionError, match="another lane"):
        alloc.check_integrity()
    lost = (free[0][1:], free[1])  # page 1 neither free nor allocated
    alloc.restore((lost, release, allocated))
    with pytest.raises(AssertionError, match="neither free nor allocated"):
        alloc.check_integrity()


def test_is_selection_contiguous_is_the_seeds_definition():
    cp = 2  # lane 0 = 1,3,5,...; lane 1 = 2,4,6,...
    assert is_selection_contiguous([1, 3, 5], cp)
    assert is_selection_contiguous([1, 2, 3, 4], cp)  # each lane steps by one physical page
    assert not is_selection_contiguous([1, 5], cp)
    assert not is_selection_contiguous([3, 1], cp)  # order matters
    assert is_selection_contiguous([7], cp)
    assert not is_selection_contiguous([], cp) and not is_selection_contiguous(None, cp)


def test_construction_errors():
    with pytest.raises(ValueError, match="physical_pages"):
        make(ReferenceL1Allocator, 0, 1)
    for cls in IMPLS:
        with pytest.raises(ValueError, match="cp_size"):
            make(cls, 4, 0)
        with pytest.raises(ValueError, match="page_size"):
            make(cls, 4, 1, ps=0)
        with pytest.raises(ValueError, match="lane order"):
            make(cls, 4, 1, order="random")
        with pytest.raises(ValueError, match="selector"):
            make(cls, 4, 1, selector="best")
        with pytest.raises(ValueError, match="repeat"):
            make(cls, 4, 1, free=[1, 1])


def test_make_l1_allocator_and_devices():
    kwargs = {"physical_pages": 4, "page_size": 1, "cp_size": 2}
    assert type(make_l1_allocator("reference", **kwargs)) is ReferenceL1Allocator
    assert type(make_l1_allocator("fast", device="cpu", **kwargs)) is FastL1Allocator
    with pytest.raises(ValueError, match="unknown L1 impl"):
        make_l1_allocator("turbo", **kwargs)
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="alloc_l1.device"):
        resolve_device("tpu", "alloc_l1.device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_unsupported():
    with pytest.raises(UnsupportedError, match="CUDA is not available"):
        resolve_device("cuda")
