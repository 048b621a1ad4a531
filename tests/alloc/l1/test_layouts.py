"""Seed 003's L1 layouts, checked against orders derived by hand from the seed's description."""

from __future__ import annotations

import pytest
import torch

from cpkv.alloc.l1.layouts import make_free_pages, make_page_owners, zigzag_owners


def free(pattern: str, physical: int, cp: int, owners: list[int], seed: int = 0) -> list[int]:
    pages = make_free_pages(
        pattern, physical_pages=physical, cp_size=cp, request_owners=owners, seed=seed
    )
    assert pages.dtype == torch.int64 and pages.device.type == "cpu"
    return pages.tolist()


def test_sequential_is_every_page_in_order():
    assert free("sequential", 8, 2, [0, 1]) == list(range(1, 17))


def test_fragmented_round_robin_by_hand():
    # physical_pages=8, cp=2, owners [0,1,0,1]: two pages per owner.
    # Run start = min(max(4, 3*2), max(0, 8-2)) = 6 -> ordinals 6, 7.
    #   owner 0 run: 1+2*6=13, 1+2*7=15; owner 1 run: 14, 16.
    # Front: ordinals 7, 5, 3, ... skipping run pages:
    #   owner 0: ordinal 7 -> 15 (in run), 5 -> 11, 3 -> 7;  owner 1: 16 (run), 12, 8.
    # Then every other page ascending.
    assert free("owner_fragmented_later_run", 8, 2, [0, 1, 0, 1]) == [
        11, 7, 12, 8, 13, 15, 14, 16, 1, 2, 3, 4, 5, 6, 9, 10,
    ]  # fmt: skip


def test_fragmented_single_owner_front_runs_out():
    # owners [0,0,0]: run start = min(max(4, 9), max(0, 5)) = 5 -> ordinals 5,6,7 = 11,13,15.
    # Front: ordinal 7 (run), 5 (run), 3 -> 7, 1 -> 3, then no ordinal left: only 2 pages.
    assert free("owner_fragmented_later_run", 8, 2, [0, 0, 0]) == [
        7, 3, 11, 13, 15, 1, 2, 4, 5, 6, 8, 9, 10, 12, 14, 16,
    ]  # fmt: skip


def test_fragmented_lane_too_short_for_a_run():
    # physical 2, cp 2, three pages for owner 0: the run would be ordinals 0..2 -> page 5 > 4,
    # so there is no run; the front takes ordinal 1 (page 3).
    assert free("owner_fragmented_later_run", 2, 2, [0, 0, 0]) == [3, 1, 2, 4]


def test_fragmented_skips_owners_without_pages():
    # cp 3, owners [2]: only lane 2 gets a front and a run (start min(max(4,3), 3) = 3).
    # run: 2+1+3*3 = 12; front: ordinal 3 -> 12 (run), ordinal 1 -> 6.
    assert free("owner_fragmented_later_run", 4, 3, [2]) == [6, 12, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11]


@pytest.mark.parametrize("seed", [0, 1, 1234])
def test_random_is_a_seeded_cpu_randperm_plus_one(seed):
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    expected = (torch.randperm(16, generator=generator, dtype=torch.int64) + 1).tolist()
    got = free("random", 8, 2, [0], seed=seed)
    assert got == expected
    assert sorted(got) == list(range(1, 17))
    assert got == free("random", 8, 2, [1, 1], seed=seed)  # owners do not matter


def test_random_depends_on_the_seed():
    assert free("random", 64, 2, [0], seed=0) != free("random", 64, 2, [0], seed=1)


def test_owner_patterns_by_hand():
    assert make_page_owners("round_robin", 7, 3) == [0, 1, 2, 0, 1, 2, 0]
    assert make_page_owners("single_owner", 4, 8) == [0, 0, 0, 0]
    # 10 pages, cp 2: 4 segments of 3,3,2,2 for owners 0,1,1,0.
    assert make_page_owners("zigzag", 10, 2) == [0, 0, 0, 1, 1, 1, 1, 1, 0, 0]
    # 5 pages, cp 4: 8 segments, the first 5 one page long: owners 0,1,2,3,3.
    assert zigzag_owners(5, 4) == [0, 1, 2, 3, 3]
    assert zigzag_owners(3, 2) == [0, 1, 1]


def test_zigzag_rises_then_falls_with_balanced_counts():
    for cp in (1, 2, 3, 8):
        for n in range(0, 50):
            owners = zigzag_owners(n, cp)
            assert len(owners) == n
            peak = owners.index(max(owners)) if owners else 0
            assert owners[:peak] == sorted(owners[:peak])
            assert owners[peak:] == sorted(owners[peak:], reverse=True)
            base, longer = divmod(n, 2 * cp)
            for owner in range(cp):
                # owner o holds segments o and 2cp-1-o; the first `longer` segments are longer
                expected = 2 * base + (owner < longer) + (2 * cp - 1 - owner < longer)
                assert owners.count(owner) == expected


@pytest.mark.parametrize("bad", ["diagonal", ""])
def test_unknown_patterns_are_value_errors(bad):
    with pytest.raises(ValueError, match="unknown owner pattern"):
        make_page_owners(bad, 4, 2)
    with pytest.raises(ValueError, match="unknown free pattern"):
        make_free_pages(bad, physical_pages=4, cp_size=2, request_owners=[0], seed=0)
