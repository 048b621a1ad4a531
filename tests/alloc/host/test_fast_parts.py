"""The pieces behind impl ``fast``: first fit, the page check, the no_run layout, the mixed op."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.alloc.host.fast.firstfit import first_fit, run_start
from cpkv.alloc.host.fast.pages import PageCheck, expand, is_run
from cpkv.alloc.host.layouts import page_order
from cpkv.alloc.host.mixed import ReplayMismatch, replay, workload
from cpkv.core.config import load_config
from tests.helpers.paths import CONFIGS

PERF_CONFIGS = sorted((CONFIGS / "perf").glob("host_*.yaml"))


def lowest_run(bits: list[bool], k: int) -> int:
    """Plain scan: the first index that starts ``k`` True values in a row; -1 if none."""
    for start in range(len(bits) - k + 1):
        if all(bits[start : start + k]):
            return start
    return -1


@settings(max_examples=300, deadline=None)
@given(
    bits=st.lists(st.booleans(), min_size=1, max_size=200),
    k=st.integers(1, 40),
    window=st.sampled_from([1, 3, 16, 2048]),
)
def test_first_fit_matches_a_plain_scan(bits: list[bool], k: int, window: int) -> None:
    assert first_fit(np.array(bits, dtype=bool), k, window) == lowest_run(bits, k)


@settings(max_examples=150, deadline=None)
@given(
    runs=st.lists(st.integers(0, 70), min_size=1, max_size=40),
    k=st.integers(2, 70),
    window=st.sampled_from([1, 7, 64, 2048]),
)
def test_first_fit_on_long_runs(runs: list[int], k: int, window: int) -> None:
    bits: list[bool] = []
    for length in runs:  # runs of free pages separated by one used page
        bits += [True] * length + [False]
    assert first_fit(np.array(bits, dtype=bool), k, window) == lowest_run(bits, k)


def test_first_fit_by_hand() -> None:
    free = np.array([0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=bool)
    assert [first_fit(free, k) for k in (1, 2, 3, 4)] == [1, 1, 4, -1]
    assert run_start(free[4:], 3) == 0 and run_start(free, 4) == -1
    assert first_fit(np.zeros(5, dtype=bool), 1) == -1


@pytest.mark.parametrize(
    ("slots", "ps", "pages"),
    [
        ([8, 9, 10, 11, 0, 1, 2, 3], 4, [2, 0]),
        ([8, 9, 10, 11, 12, 13, 14, 15], 4, [2, 3]),  # a run: checked against a table slice
        ([8, 9, 11, 10], 4, None),
        ([0, 1, 1, 3], 4, None),  # spans 3 but repeats a slot
        ([0, 2, 1, 3], 4, None),  # spans 3 but out of order
        ([9, 10, 11, 12], 4, None),
        ([8, 9, 10], 4, None),
        ([-4, -3, -2, -1], 4, None),
        ([6, 7, 8, 0, 1, 2], 3, [2, 0]),  # a page size that is not a power of two
        ([6, 7, 9], 3, None),
        ([5, 3, 4], 1, [5, 3, 4]),
        ([], 4, []),
    ],
)
def test_page_check_by_hand(slots: list[int], ps: int, pages: list[int] | None) -> None:
    got = PageCheck(ps).pages(np.array(slots, dtype=np.int64))
    assert (None if got is None else got.tolist()) == pages


def whole_pages_brute(slots: list[int], ps: int) -> list[int] | None:
    """The definition: every chunk of ``ps`` slots is ``p*ps .. p*ps + ps - 1`` for some p >= 0."""
    if len(slots) % ps:
        return None
    chunks = [slots[i : i + ps] for i in range(0, len(slots), ps)]
    if any(c[0] < 0 or c[0] % ps or c != list(range(c[0], c[0] + ps)) for c in chunks):
        return None
    return [c[0] // ps for c in chunks]


@settings(max_examples=300, deadline=None)
@given(
    pages=st.lists(st.integers(0, 30), max_size=12),
    ps=st.sampled_from([1, 2, 3, 4, 8]),
    edits=st.lists(st.tuples(st.integers(0, 200), st.integers(-9, 9)), max_size=2),
    block=st.sampled_from([1, 2, 3, 1 << 15]),
)
def test_page_check_matches_the_definition(pages, ps, edits, block) -> None:
    slots = [p * ps + o for p in pages for o in range(ps)]
    for where, delta in edits:  # near misses: one slot moved a little
        if slots:
            slots[where % len(slots)] += delta
    checker = PageCheck(ps)
    checker.block = max(ps, block - block % ps)  # several check blocks per call, too
    got = checker.pages(np.array(slots, dtype=np.int64))
    assert (None if got is None else got.tolist()) == whole_pages_brute(slots, ps)


def test_page_check_blocks_and_expand_round_trip() -> None:
    rng = np.random.default_rng(0)
    pages = rng.permutation(5000)[:1500]
    slots = expand(pages, 64)
    assert slots.tolist() == [p * 64 + o for p in pages.tolist() for o in range(64)]
    checker = PageCheck(64)
    assert checker.pages(slots).tolist() == pages.tolist()  # spans several check blocks
    broken = slots.copy()
    broken[-5] += 1  # the last block is checked too
    assert checker.pages(broken) is None
    assert expand(np.arange(7, 10), 4).tolist() == list(range(28, 40))
    assert (
        is_run(np.array([3, 4, 5]))
        and not is_run(np.array([3, 5, 4]))
        and not is_run(np.array([4, 3]))
    )


@pytest.mark.parametrize(("total", "need"), [(10, 3), (64, 8), (9, 1)])
def test_no_run_layout_has_no_qualifying_run(total: int, need: int) -> None:
    order = page_order(total, need, "no_run", seed=5)
    gap = max(need, 2)
    assert sorted(order) == [p for p in range(total) if p % gap != gap - 1]
    assert order == page_order(total, need, "no_run", seed=5) != sorted(order)
    free = [p in set(order) for p in range(total)]
    assert lowest_run(free, max(need, 2)) == -1


def test_no_run_needs_half_the_pool(cli) -> None:
    res = cli("alloc", "host", "alloc_host.host_sizes_gb=[]", "alloc_host.host_pages=[100]",
              "alloc_host.patterns=[no_run]", "alloc_host.request_pages=[64]")  # fmt: skip
    assert res.exit_code == 2 and "allowed: 1..50" in res.stderr


def test_workload_is_seeded_and_shaped() -> None:
    ops = workload(7, [1, 8, 64, 512])
    assert ops == workload(7, [1, 8, 64, 512]) != workload(8, [1, 8, 64, 512])
    kinds = [op.kind for op in ops]
    assert len(ops) == 600 and 0.38 < kinds.count("free") / 600 < 0.52
    allocs = [op for op in ops if op.kind != "free"]
    assert 0.08 < sum(op.kind == "fifo" for op in allocs) / len(allocs) < 0.22
    assert {op.pages for op in allocs} == {1, 8, 64, 512}


def test_replay_reports_a_differing_impl() -> None:
    from cpkv.alloc.host.bench import is_page_contiguous
    from cpkv.alloc.host.reference import HostAllocator

    class Wrong(HostAllocator):
        def alloc_contiguous_preferred(self, need_size):
            return self.alloc(need_size)  # never looks for a run

    base = torch.tensor([p * 2 + o for p in (5, 1, 2, 7, 3, 0, 4, 6) for o in range(2)])
    ops = workload(1, [1, 2, 3])
    expected = replay(HostAllocator(2, base.clone()), ops, 2, is_page_contiguous, keep=True)
    with pytest.raises(ReplayMismatch, match="selected differently"):
        replay(Wrong(2, base.clone()), ops, 2, is_page_contiguous, expected=expected)


def test_mixed_op_and_ratio_column(cli) -> None:
    res = cli("alloc", "host", "alloc_host.host_sizes_gb=[]", "alloc_host.host_pages=[300]",
              "alloc_host.request_pages=[1,8]", "alloc_host.patterns=[random_fragmented]",
              "alloc_host.impls=[reference,fast]", "alloc_host.ops=[mixed,alloc]",
              "alloc_host.repeat=2", "alloc_host.warmup=0")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "vs_reference" in res.output and "total_us" in res.output
    rows = cli.results(cli.run_dirs()[0])["rows"]
    mixed = {(r["impl"], r["method"]): r for r in rows if r["op"] == "mixed"}
    assert set(mixed) == {
        (i, m) for i in ("reference", "fast") for m in ("all", "contiguous", "fifo", "free")
    }
    ref, fast = mixed["reference", "all"], mixed["fast", "all"]
    assert (
        ref["repeat"]
        == fast["repeat"]
        == sum(mixed["fast", m]["repeat"] for m in ("contiguous", "fifo", "free"))
    )
    assert ref["vs_reference"] == 1.0
    assert fast["vs_reference"] == pytest.approx(ref["total_us"] / fast["total_us"])
    alloc_rows = [r for r in rows if r["op"] == "alloc" and r["impl"] == "fast"]
    assert len(alloc_rows) == 4 and all(r["vs_reference"] > 0 for r in alloc_rows)


def test_no_ratio_column_without_the_reference(cli) -> None:
    res = cli("alloc", "host", "alloc_host.host_sizes_gb=[]", "alloc_host.host_pages=[300]",
              "alloc_host.request_pages=[8]", "alloc_host.impls=[fast]", "alloc_host.repeat=2")  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = cli.results(cli.run_dirs()[0])["rows"]
    assert "vs_reference" not in res.output and all(r["vs_reference"] is None for r in rows)


@pytest.mark.parametrize("path", PERF_CONFIGS, ids=lambda p: p.name)
def test_perf_configs_load(path: Path) -> None:
    block = load_config("alloc_host", path).experiment.alloc_host
    assert set(block.impls) == {"reference", "fast"} and block.pool_pages() == [34375]


def test_median_replay_checks_once_and_times_separately() -> None:
    from cpkv.alloc.host.bench import is_page_contiguous
    from cpkv.alloc.host.mixed import median_replay
    from cpkv.alloc.host.reference import HostAllocator

    class Wrong(HostAllocator):
        def alloc_contiguous_preferred(self, need_size):
            return self.alloc(need_size)

    base = torch.tensor([p * 2 + o for p in (5, 1, 2, 7, 3, 0, 4, 6) for o in range(2)])
    ops = workload(2, [1, 2, 3])
    made: list = []

    def make(cls):
        def build():
            made.append(cls(2, base.clone()))
            return made[-1]

        return build

    want = median_replay(make(HostAllocator), ops, 2, is_page_contiguous, keep=True, times=3)
    assert len(made) == 4  # one checked replay, three timed ones
    direct = replay(HostAllocator(2, base.clone()), ops, 2, is_page_contiguous, keep=True)
    assert want.hits == direct.hits and want.free_list == direct.free_list
    assert [None if s is None else s.tolist() for s in want.selections] == [
        None if s is None else s.tolist() for s in direct.selections
    ]
    assert sum(len(v) for v in want.us.values()) == sum(len(v) for v in direct.us.values())
    with pytest.raises(ReplayMismatch):
        median_replay(make(Wrong), ops, 2, is_page_contiguous, expected=want, times=1)


def test_warm_rows_count_contiguous_selections(cli) -> None:
    res = cli("alloc", "host", "alloc_host.host_sizes_gb=[]", "alloc_host.host_pages=[400]",
              "alloc_host.request_pages=[8]", "alloc_host.patterns=[fragmented_prefix_later_run]",
              "alloc_host.impls=[reference,fast]", "alloc_host.ops=[alloc,free]",
              "alloc_host.protocol=warm", "alloc_host.repeat=4", "alloc_host.warmup=0")  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = cli.results(cli.run_dirs()[0])["rows"]
    ratio = {(r["impl"], r["method"], r["op"]): r["contiguous_ratio"] for r in rows}
    # FIFO on a free list: take the head, give it back at the tail; count by hand.
    from collections import deque

    from cpkv.alloc.host.layouts import page_order

    free, fifo_hits = deque(page_order(400, 8, "fragmented_prefix_later_run", 0)), 0
    for _ in range(4):
        pages = [free.popleft() for _ in range(8)]
        fifo_hits += all(b - a == 1 for a, b in zip(pages, pages[1:], strict=False))
        free.extend(pages)
    assert 0 < fifo_hits < 4  # the layout makes some FIFO samples scattered, some not
    for impl in ("reference", "fast"):  # the run, then the run again after its free
        assert ratio[impl, "contiguous", "alloc"] == ratio[impl, "contiguous", "free"] == 1.0
        assert ratio[impl, "fifo", "alloc"] == ratio[impl, "fifo", "free"] == fifo_hits / 4
    assert all(r["repeat"] == 4 for r in rows)
