"""What impl ``fast`` hands out (lent run views, copies) and how frees of its own selections
skip reading them (receipts), checked against the reference and the brute-force model."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from cpkv.alloc.host.fast import FastHostAllocator
from cpkv.alloc.host.fast.handouts import Receipts
from cpkv.alloc.host.layouts import free_slots
from cpkv.alloc.host.reference import HostAllocator
from tests.helpers.host_model import brute_force


def _pair(ps: int, pages: list[int]) -> tuple[FastHostAllocator, HostAllocator, list[int]]:
    slots = [p * ps + o for p in pages for o in range(ps)]
    fast = FastHostAllocator(ps, torch.tensor(slots, dtype=torch.int64))
    return fast, HostAllocator(ps, torch.tensor(slots, dtype=torch.int64)), slots


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return np.shares_memory(a.numpy(), b.numpy())


def _count_claims(monkeypatch) -> dict[str, int]:
    """Count frees whose pages were known (not read) and frees read in full."""
    seen = {"known": 0, "read": 0}
    original = FastHostAllocator._known

    def known(self, tensor):
        out = original(self, tensor)
        seen["known" if out is not None else "read"] += 1
        return out

    monkeypatch.setattr(FastHostAllocator, "_known", known)
    return seen


def test_a_run_is_lent_once_then_copied() -> None:
    fast, ref, _ = _pair(4, [9, 1, 2, 3, 4, 7])
    first = fast.alloc_contiguous_preferred(16)  # pages 1-4: a view of the slot table
    assert first.tolist() == ref.alloc_contiguous_preferred(16).tolist() == list(range(4, 20))
    assert first._base is not None and first.untyped_storage().nbytes() > first.numel() * 8
    fast.free(first)
    fast.alloc(4)  # page 9 goes; pages 7, 1-4 stay in the queue in that order
    again = fast.alloc_contiguous_preferred(16)
    assert again.tolist() == list(range(4, 20)) and not _shares_memory(first, again)
    first.numpy()[:] = -1  # even behind torch's back: the pages are never lent again
    fast.free(again)
    assert fast.alloc_contiguous_preferred(16).tolist() == list(range(4, 20))


def test_writes_reaching_past_a_lent_view_stop_lending() -> None:
    fast, ref, _ = _pair(4, [5, 0, 1, 2, 3, 4, 6, 7, 8, 9])
    lent, want = fast.alloc_contiguous_preferred(8), ref.alloc_contiguous_preferred(8)
    assert lent.tolist() == want.tolist() == list(range(8))  # pages 0-1: a view of the table
    lent.as_strided((40,), (1,), 0).fill_(-7)  # reaches the pages never lent, too
    for n in (8, 12, 4):
        assert (
            fast.alloc_contiguous_preferred(n).tolist()
            == ref.alloc_contiguous_preferred(n).tolist()
        )
    assert not fast._runs.lending
    assert fast.free(want.clone()) == ref.free(want.clone())
    assert fast.free_slot_list() == ref.free_slot_list()


def test_lent_table_stops_lending_after_any_torch_write() -> None:
    fast, ref, _ = _pair(2, [5, 0, 1, 2, 3, 4, 6, 7])
    run = fast.alloc_contiguous_preferred(6)  # pages 0-2, lent
    assert run.tolist() == ref.alloc_contiguous_preferred(6).tolist() == list(range(6))
    run.add_(100)  # bumps the table's version counter
    later = fast.alloc_contiguous_preferred(4)  # FIFO prefix 5, 3, ... not a run: pages 3-4
    assert later.tolist() == ref.alloc_contiguous_preferred(4).tolist() == [6, 7, 8, 9]
    assert not fast._runs.lending and not _shares_memory(run, later)


@pytest.mark.parametrize("how", ["add", "permute", "resize", "unsqueeze"])
def test_a_selection_written_in_place_is_read_in_full(monkeypatch, how) -> None:
    """The reference frees what the tensor holds now; fast must not trust its receipt."""
    seen = _count_claims(monkeypatch)
    fast, ref, _ = _pair(4, [8, 3, 0, 1, 2, 9, 5, 6])
    got, want = fast.alloc_contiguous_preferred(12), ref.alloc_contiguous_preferred(12)
    assert got.tolist() == want.tolist() == list(range(12))
    for t in (got, want):
        if how == "add":
            t.add_(40)  # pages 10-12, still whole pages
        elif how == "permute":
            t.copy_(t.view(3, 4).flip(0).reshape(-1))
        elif how == "resize":
            t.resize_(8)
        else:
            t.unsqueeze_(0)
    if how == "unsqueeze":  # the reference's torch.cat fails on a 2-D tensor: so must fast
        with pytest.raises(RuntimeError):
            ref.free(want)
        with pytest.raises(RuntimeError):
            fast.free(got)
        return
    assert fast.free(got) == ref.free(want)
    assert seen == {"known": 0, "read": 1}
    assert fast.free_slot_list() == ref.free_slot_list()
    for n in (4, 12, 8):
        assert (
            fast.alloc_contiguous_preferred(n).tolist()
            == ref.alloc_contiguous_preferred(n).tolist()
        )


def test_freeing_the_same_selection_twice_matches_the_reference() -> None:
    fast, ref, slots = _pair(2, [3, 4, 0, 1, 2])
    got, want = fast.alloc(4), ref.alloc(4)
    for _ in range(2):
        assert fast.free(got) == ref.free(want)
    assert fast.exact is not None and "already free" in fast.fallback_reason
    assert fast.free_slot_list() == ref.free_slot_list() == slots[4:] + slots[:4] * 2


def test_views_are_known_by_their_offset_copies_are_read(monkeypatch) -> None:
    """Whole-page views of the adopted slots or the slot table show known slots; others not."""
    seen = _count_claims(monkeypatch)
    fast, ref, _ = _pair(4, [11, 10, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    got, want = fast.alloc(16), ref.alloc(16)  # pages 11, 10, 0, 1: a view of the adopted slots
    assert fast.free(got.view(-1)[8:]) == ref.free(want.view(-1)[8:])  # pages 0, 1: known
    assert fast.free_slot_list() == ref.free_slot_list() and seen == {"known": 1, "read": 0}
    fast, ref, _ = _pair(4, [9, 0, 1, 2, 3])
    lent, want = fast.alloc_contiguous_preferred(12), ref.alloc_contiguous_preferred(12)
    assert lent.tolist() == want.tolist() == list(range(12)) and lent._base is not None
    assert fast.free(lent[4:]) == ref.free(want[4:])  # pages 1, 2 of the table: known
    assert fast.free(lent[:2]) == ref.free(want[:2])  # half a page: read, and it falls back
    assert fast.exact is not None and seen == {"known": 2, "read": 1}
    assert fast.free_slot_list() == ref.free_slot_list()
    fast, ref, _ = _pair(4, list(range(12)))
    got, want = fast.alloc(8), ref.alloc(8)
    assert fast.free(got[4:].clone()) == ref.free(want[4:].clone())  # a copy: read
    assert fast.free(got[:4]) == ref.free(want[:4])  # known
    assert seen == {"known": 3, "read": 2}
    assert fast.free_slot_list() == ref.free_slot_list() and fast.exact is None


def test_fifo_selections_freed_in_any_order_skip_the_read(monkeypatch) -> None:
    seen = _count_claims(monkeypatch)
    rng = random.Random(4)
    for trial in range(30):
        pages = rng.sample(range(40), 30)
        fast, ref, slots = _pair(2, pages)
        model, held = list(slots), []
        for _ in range(rng.randint(1, 8)):
            n = 2 * rng.randint(1, 4)
            got, want = fast.alloc(n), ref.alloc(n)
            expected, model = brute_force(model, n, 2, False)
            assert got.tolist() == want.tolist() == expected
            held.append((got, want))
        rng.shuffle(held)
        if trial % 3 == 0:  # a search in between syncs the bitmap first
            want = ref.alloc_contiguous_preferred(4)
            assert fast.alloc_contiguous_preferred(4).tolist() == want.tolist()
            expected, model = brute_force(model, 4, 2, True)
            assert want.tolist() == expected
        for got, want in held:
            assert fast.free(got) == ref.free(want)
            model += want.tolist()
            assert fast.free_slot_list() == ref.free_slot_list() == model
        assert fast.exact is None
    assert seen["read"] == 0 and seen["known"] > 100


def test_receipts_recognise_the_same_unchanged_tensor_and_purge_dropped_ones(monkeypatch) -> None:
    monkeypatch.setattr("cpkv.alloc.host.fast.handouts.PURGE_AT", 16)
    receipts, pages = Receipts(), np.arange(3)
    for _ in range(200):
        receipts.note(torch.zeros(1, dtype=torch.int64), pages, True)  # dropped at once
    assert len(receipts) < 32
    kept = [torch.zeros(1, dtype=torch.int64) for _ in range(100)]
    for t in kept:
        receipts.note(t, pages, False, ("queue", 1, 4))
    assert len(receipts) >= 100
    assert receipts.claim(kept[0].clone()) is None and receipts.claim(kept[1][:]) is None
    kept[2].add_(0)  # written in place: not recognised (and forgotten)
    assert receipts.claim(kept[2]) is None and receipts.claim(kept[2]) is None
    for t in kept[3:]:
        got = receipts.claim(t)
        assert got is not None and got[0] is pages and got[1:] == (False, ("queue", 1, 4))
        assert receipts.claim(t) is None  # claimed once
    assert len(receipts) < 32


@pytest.mark.parametrize("built_inside", [True, False])
def test_inference_mode_reads_every_free_and_matches(monkeypatch, built_inside) -> None:
    """Inference tensors have no version counter: nothing is trusted, results still match."""
    seen = _count_claims(monkeypatch)
    base = free_slots(300, 8, 4, "random_fragmented", seed=2)
    if not built_inside:
        fast, ref = FastHostAllocator(4, base.clone()), HostAllocator(4, base.clone())
    with torch.inference_mode():
        if built_inside:
            fast, ref = FastHostAllocator(4, base.clone()), HostAllocator(4, base.clone())
        held = []
        calls = [
            (32, "alloc_contiguous_preferred"),
            (8, "alloc"),
            (32, "alloc_contiguous_preferred"),
        ]
        for n, method in calls * 3:
            got, want = getattr(fast, method)(n), getattr(ref, method)(n)
            assert torch.equal(got, want)
            held.append((got, want))
        for got, want in held:
            assert fast.free(got) == ref.free(want)
    assert fast.free_slot_list() == ref.free_slot_list() and fast.exact is None
    if built_inside:
        assert seen["known"] == 0
    else:  # views of tensors made outside keep their version counter
        assert seen["known"] > 0


def test_bench_layout_selections_never_share_memory() -> None:
    """Selections held at the same time are disjoint tensors, as the reference's are."""
    ps = 16
    base = free_slots(2000, 64, ps, "fragmented_prefix_later_run", seed=0)
    fast, ref = FastHostAllocator(ps, base.clone()), HostAllocator(ps, base.clone())
    rng, held = random.Random(1), []
    for step in range(120):
        if held and rng.random() < 0.45:
            got, want = held.pop(rng.randrange(len(held)))
            assert fast.free(got) == ref.free(want)
            continue
        n = ps * rng.choice([1, 8, 64])
        method = rng.choice(["alloc", "alloc_contiguous_preferred", "alloc_contiguous_preferred"])
        got, want = getattr(fast, method)(n), getattr(ref, method)(n)
        assert torch.equal(got, want), step
        for other, _ in held:
            assert not _shares_memory(got, other)
        held.append((got, want))
    assert fast.free_slot_list() == ref.free_slot_list() and fast.exact is None


def test_freeing_something_else_fails_as_the_reference_does() -> None:
    fast, ref, _ = _pair(2, [0, 1, 2])
    for bad in ([0, 1], np.array([0, 1])):
        with pytest.raises(AttributeError):
            ref.free(bad)
        with pytest.raises(AttributeError):
            fast.free(bad)
    assert fast.free_slot_list() == ref.free_slot_list()
