"""Impl ``fast`` of the host allocator gives the reference's answers after every operation.

Two independent references: the torch reference (``cpkv.alloc.host.reference``) and the plain-list
brute-force model of seed 003's rule in ``test_host_alloc``. Small pools and a tiny
compaction floor reach every code path (first-fit hits, no-fit fallbacks, tombstones in
FIFO windows, compactions); frees come back in their original and in shuffled page order.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.alloc.host.fast import FastHostAllocator
from cpkv.alloc.host.layouts import free_slots
from cpkv.alloc.host.reference import HostAllocator
from tests.helpers.host_model import brute_force


class TinyFast(FastHostAllocator):
    """Compacts as soon as tombstones outnumber free pages (and at 2 queue rows)."""

    min_rows = 2


def _tensor(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _same(got, want) -> bool:
    if got is None or want is None:
        return got is None and want is None
    return got.dtype == want.dtype and got.dim() == 1 and torch.equal(got, want)


def _shuffle_pages(block: torch.Tensor, ps: int, rng: random.Random) -> torch.Tensor:
    rows = block.view(-1, ps)
    order = list(range(rows.shape[0]))
    rng.shuffle(order)
    return rows[order].reshape(-1)


FREE_MODES = ("same", "same", "same", "clone", "shuffled", "split")
WRITES = ("rewritten", "touched")  # in place: the version counter of every view moves


def _give_back(fast, ref, pair, ps: int, rng: random.Random, held: list, writes: bool) -> list[int]:
    """Free one held selection in a random way (the same on both sides); the freed slots.

    ``same`` frees the very tensors the allocators returned (fast's receipt path);
    ``rewritten`` permutes the pages in place first and ``touched`` writes the same values
    back in place (both bump torch's version counter, so fast must read them in full);
    ``clone``/``shuffled``/``split`` free other tensors with the same or reordered slots.
    """
    got, want = pair
    mode = rng.choice(FREE_MODES + WRITES if writes else FREE_MODES)
    if mode == "shuffled":
        got = want = _shuffle_pages(want, ps, rng)
    elif mode == "split" and want.numel() > ps:  # give part back now, the rest later
        cut = ps * rng.randint(1, want.numel() // ps - 1)
        held.append((got[cut:].clone(), want[cut:].clone()))
        got, want = got[:cut].clone(), want[:cut].clone()
    elif mode == "rewritten":
        order = _shuffle_pages(want, ps, rng)
        got.copy_(order)
        want.copy_(order)
    elif mode == "touched":
        got.add_(0)
        want.add_(0)
    elif mode != "same":
        got, want = got.clone(), want.clone()
    slots = want.tolist()
    assert fast.free(got) == ref.free(want)
    return slots


def _drive(
    fast,
    free: list[int],
    ps: int,
    rng: random.Random,
    steps: int,
    sizes: list[int],
    writes: bool = True,
) -> None:
    """Random FIFO / contiguous / free calls on ``fast``, the reference and the list model.

    ``writes``: some frees write into the selection in place first (then nothing handed
    out from the same tensor is trusted any more, so runs without them are needed too).
    """
    ref = HostAllocator(ps, _tensor(free))
    model, held = list(free), []
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.4 and held:
            pair = held.pop(rng.randrange(len(held)))
            model = model + _give_back(fast, ref, pair, ps, rng, held, writes)
        else:
            n = rng.choice(sizes) * ps
            contiguous = roll >= 0.55
            method = "alloc_contiguous_preferred" if contiguous else "alloc"
            got, want = getattr(fast, method)(n), getattr(ref, method)(n)
            assert _same(got, want)
            expected, model = brute_force(model, n, ps, contiguous)
            assert (None if got is None else got.tolist()) == expected
            if got is not None and got.numel():
                held.append((got, want))
        assert fast.available_size() == ref.available_size() == len(model)
        assert fast.free_slot_list() == model
        for got, want in held:  # what the caller holds never changes behind its back
            assert torch.equal(got, want)


@settings(max_examples=250, deadline=None)
@given(
    pages=st.integers(1, 40),
    ps=st.sampled_from([1, 2, 3, 4]),
    seed=st.integers(0, 2**31),
    sorted_start=st.booleans(),
    tiny=st.booleans(),
    writes=st.booleans(),
)
def test_random_sequences_match_reference_and_model(
    pages, ps, seed, sorted_start, tiny, writes
) -> None:
    rng = random.Random(seed)
    order = sorted(rng.sample(range(pages), rng.randint(0, pages)))
    if not sorted_start:
        rng.shuffle(order)
    free = [p * ps + o for p in order for o in range(ps)]
    fast = (TinyFast if tiny else FastHostAllocator)(ps, _tensor(free))
    _drive(fast, free, ps, rng, steps=40, sizes=[0, 1, 2, 3, 4, 6, 9], writes=writes)
    assert fast.exact is None, fast.fallback_reason


def test_stress_reaches_every_code_path(monkeypatch) -> None:
    """A deterministic stress run, counting the paths it took (all must be taken)."""
    seen: Counter = Counter()

    def spy(name, count):
        original = getattr(FastHostAllocator, name)

        def wrapper(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            seen[count(self, args, result)] += 1
            return result

        monkeypatch.setattr(FastHostAllocator, name, wrapper)

    spy("_take_run", lambda s, a, r: "first-fit hit")
    spy("_compact", lambda s, a, r: "compaction")
    spy("_window", lambda s, a, r: "tombstones in a FIFO window" if r[1] else "clean window")
    spy("_sync", lambda s, a, r: "sync")
    spy("_give_back_unsynced", lambda s, a, r: "free around unsynced FIFO rows")
    spy("_give_back", lambda s, a, r: "free of known pages" if a[2] else "free read in full")
    original_search = FastHostAllocator.alloc_contiguous_preferred

    def search(self, n):
        before = self._nofit
        out = original_search(self, n)
        if self._nofit is not None and self._nofit != before:
            seen["no-fit fallback"] += 1
        return out

    monkeypatch.setattr(FastHostAllocator, "alloc_contiguous_preferred", search)
    original_known = FastHostAllocator._known

    def known(self, slots):  # where free learnt the pages of a selection without reading it
        receipts = len(self._receipts)
        out = original_known(self, slots)
        if out is not None:
            by_receipt = len(self._receipts) < receipts
            lent = (
                slots.data_ptr() >= self._runs.known.lo and slots.data_ptr() < self._runs.known.hi
            )
            seen["known by receipt" if by_receipt else "lent view" if lent else "adopted view"] += 1
        return out

    monkeypatch.setattr(FastHostAllocator, "_known", known)
    for seed in range(12):
        rng = random.Random(seed)
        tiny = seed % 3 > 0  # the others keep their adopted slots for longer (bigger pools)
        ps, pages = rng.choice([1, 2, 4]), rng.randint(8, 60) if tiny else rng.randint(200, 400)
        order = list(range(pages))
        rng.shuffle(order)
        free = [p * ps + o for p in order for o in range(ps)]
        fast = (TinyFast if tiny else FastHostAllocator)(ps, _tensor(free))
        _drive(fast, free, ps, rng, steps=150, sizes=[1, 2, 3, 5, 8], writes=seed % 2 == 1)
    paths = (
        "first-fit hit", "no-fit fallback", "tombstones in a FIFO window", "compaction",
        "free of known pages", "free read in full", "known by receipt", "lent view",
        "adopted view", "free around unsynced FIFO rows",
    )  # fmt: skip
    for path in paths:  # the last is rarer here; test_host_fast_handouts takes it often
        assert seen[path] >= (10 if path.startswith("free around") else 20), (path, seen)


@pytest.mark.parametrize(
    "pattern", ["contiguous_fifo", "fragmented_prefix_later_run", "random_fragmented", "no_run"]
)
@pytest.mark.parametrize("req", [1, 8, 64])
def test_bench_layouts_give_the_same_selections(pattern: str, req: int) -> None:
    ps, total = 16, 3000
    base = free_slots(total, req, ps, pattern, seed=3)
    ref, fast = HostAllocator(ps, base.clone()), FastHostAllocator(ps, base.clone())
    for method in ("alloc_contiguous_preferred", "alloc", "alloc_contiguous_preferred"):
        got, want = getattr(fast, method)(req * ps), getattr(ref, method)(req * ps)
        assert _same(got, want)
        fast.free(got[: ps * (req // 2)])
        ref.free(want[: ps * (req // 2)])
        assert torch.equal(fast.free_slots, ref.free_slots)


@pytest.mark.parametrize(
    "pattern", ["contiguous_fifo", "fragmented_prefix_later_run", "random_fragmented", "no_run"]
)
def test_mixed_workload_replays_identically(pattern: str) -> None:
    """The bench's own mixed workload (600 ops) on a 1,500-page pool, checked op by op."""
    from cpkv.alloc.host.bench import is_page_contiguous
    from cpkv.alloc.host.mixed import replay, workload

    ps, ops = 16, workload(11, [1, 8, 64])
    base = free_slots(1500, 64, ps, pattern, seed=11)
    want = replay(HostAllocator(ps, base.clone()), ops, ps, is_page_contiguous, keep=True)
    for cls in (FastHostAllocator, TinyFast):
        fast = cls(ps, base.clone())
        got = replay(fast, ops, ps, is_page_contiguous, expected=want)  # raises on a difference
        assert got.hits == want.hits and fast.exact is None


def test_adopted_tensor_is_not_modified_and_fifo_is_a_view() -> None:
    base = free_slots(200, 8, 4, "random_fragmented", seed=1)
    kept = base.clone()
    fast = FastHostAllocator(4, base)
    first = fast.alloc(32)
    assert first.data_ptr() == base.data_ptr()  # as the reference: a view of the free list
    fast.alloc_contiguous_preferred(32)
    fast.free(first)
    assert torch.equal(base, kept)


@pytest.mark.parametrize(
    ("slots", "reason"),
    [
        ([0, 1, 2, 3, 5, 4, 6, 7], "whole aligned pages"),  # swapped inside a page
        ([1, 2, 3, 4, 8, 9, 10, 11], "whole aligned pages"),  # unaligned page
        ([0, 1, 2, 3, 4, 5], "whole aligned pages"),  # partial page
        ([4, 5, 6, 7, 4, 5, 6, 7], "twice"),
    ],
)
def test_free_lists_breaking_the_invariant_fall_back_to_the_reference(slots, reason) -> None:
    fast = FastHostAllocator(4, _tensor(slots))
    assert fast.exact is not None and reason in fast.fallback_reason
    ref = HostAllocator(4, _tensor(slots))
    for n in (4, 8):
        assert _same(fast.alloc_contiguous_preferred(n), ref.alloc_contiguous_preferred(n))
    assert fast.free_slot_list() == ref.free_slot_list()


@pytest.mark.parametrize(
    ("freed", "reason"),
    [
        ([40, 41, 42], "whole aligned pages"),
        ([41, 42, 43, 44], "whole aligned pages"),
        ([8, 9, 10, 11], "already free"),  # page 2 is free
        ([40, 41, 42, 43, 40, 41, 42, 43], "twice"),
        ([-4, -3, -2, -1], "whole aligned pages"),
    ],
)
def test_frees_breaking_the_invariant_fall_back_exactly(freed, reason) -> None:
    free = [p * 4 + o for p in (3, 0, 7, 1, 2) for o in range(4)]
    fast, ref = FastHostAllocator(4, _tensor(free)), HostAllocator(4, _tensor(free))
    assert _same(fast.alloc_contiguous_preferred(8), ref.alloc_contiguous_preferred(8))
    assert fast.free(_tensor(freed)) == ref.free(_tensor(freed))
    assert fast.exact is not None and reason in fast.fallback_reason
    assert fast.free_slot_list() == ref.free_slot_list()
    for n in (8, 4, 12):
        assert _same(fast.alloc_contiguous_preferred(n), ref.alloc_contiguous_preferred(n))
        assert _same(fast.alloc(4), ref.alloc(4))


def test_freeing_pages_beyond_the_initial_pool_grows_the_index() -> None:
    fast, ref = FastHostAllocator(2, _tensor([2, 3, 0, 1])), HostAllocator(2, _tensor([2, 3, 0, 1]))
    block = _tensor([40, 41, 42, 43, 44, 45])
    fast.free(block.clone())
    ref.free(block.clone())
    assert fast.exact is None
    for n in (6, 2, 4):
        assert _same(fast.alloc_contiguous_preferred(n), ref.alloc_contiguous_preferred(n))
    assert fast.free_slot_list() == ref.free_slot_list()


def test_errors_and_empty_requests_match() -> None:
    fast, ref = FastHostAllocator(4, torch.arange(16)), HostAllocator(4, torch.arange(16))
    for method in ("alloc", "alloc_contiguous_preferred"):
        with pytest.raises(ValueError):
            getattr(fast, method)(3)
        assert getattr(fast, method)(20) is None and getattr(ref, method)(20) is None
        assert _same(getattr(fast, method)(0), getattr(ref, method)(0))
    assert fast.free(torch.empty(0, dtype=torch.int64)) == 0


def test_no_fit_is_forgotten_after_a_free() -> None:
    # pages 0, 2, 4 free: no run of 2; freeing page 1 creates the run 0-1-2
    fast = FastHostAllocator(1, _tensor([4, 0, 2]))
    assert fast.alloc_contiguous_preferred(2).tolist() == [4, 0]  # no run: FIFO
    fast.free(_tensor([1]))
    assert fast.free_slot_list() == [2, 1]
    assert fast.alloc_contiguous_preferred(2).tolist() == [1, 2]  # the new run


@pytest.mark.slow
@pytest.mark.parametrize(
    "pattern", ["contiguous_fifo", "fragmented_prefix_later_run", "random_fragmented", "no_run"]
)
def test_220gb_bench_cases_give_the_same_selections(pattern: str) -> None:
    """At full size (34,375 pages of 64): a few calls per request size, shuffled frees."""
    rng = random.Random(0)
    for req in (1, 8, 512):
        base = free_slots(34375, req, 64, pattern, seed=0)
        ref, fast = HostAllocator(64, base.clone()), FastHostAllocator(64, base.clone())
        for method in ("alloc_contiguous_preferred", "alloc", "alloc_contiguous_preferred"):
            got, want = getattr(fast, method)(req * 64), getattr(ref, method)(req * 64)
            assert _same(got, want)
            block = _shuffle_pages(want, 64, rng)
            assert fast.free(block.clone()) == ref.free(block.clone())
        assert torch.equal(fast.free_slots, ref.free_slots) and fast.exact is None
