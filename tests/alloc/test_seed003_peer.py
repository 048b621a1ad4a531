"""cpkv against seed 003's own script, run as a peer: the same layouts, page for page, and the
same selections.

The seed is read from ``../shared/seeds`` at test time and executed as a module (nothing of
it is copied into cpkv); without that folder the tests are skipped. Its sglang imports are
lazy, so only its standalone models run here.
"""

from __future__ import annotations

import random
import sys
import types

import pytest
import torch

from cpkv.alloc.host.fast import FastHostAllocator
from cpkv.alloc.host.layouts import page_order
from cpkv.alloc.host.reference import HostAllocator
from cpkv.alloc.l1.layouts import make_free_pages, make_page_owners
from cpkv.alloc.l1.reference import make_l1_allocator
from tests.helpers.paths import SHARED

SEEDS = SHARED / "seeds"
SEED_003 = next(iter(sorted(SEEDS.glob("003_*.txt"))), None) if SEEDS.is_dir() else None
pytestmark = pytest.mark.skipif(SEED_003 is None, reason="seed 003 is not in ../shared/seeds")


@pytest.fixture(scope="module")
def seed():
    """The seed script as a module (its first line is the path it had upstream)."""
    text = SEED_003.read_text()
    module = types.ModuleType("cpkv_test_seed003")
    code = text.split("\n", 1)[1] if not text.startswith(("from", "import", '"""')) else text
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    try:
        exec(compile(code, str(SEED_003), "exec"), module.__dict__)  # noqa: S102 - a peer
        yield module
    finally:
        del sys.modules[module.__name__]


def _cases(rng: random.Random, n: int, small: bool) -> list[tuple[int, int, int]]:
    """(total pages, request pages, seed): every pair for tiny pools, then random ones."""
    out = [(t, r, 0) for t in range(1, 13) for r in range(1, t + 1)] if small else []
    for _ in range(n):
        total = rng.randint(1, 400)
        out.append((total, rng.randint(1, total), rng.randint(0, 50)))
    return out


def test_host_layouts_and_selections_equal_the_seeds(seed) -> None:
    rng = random.Random(3)
    for total, req, s in _cases(rng, 120, small=True):
        ps = rng.choice([1, 2, 4])
        for pattern in ("contiguous_fifo", "fragmented_prefix_later_run", "random_fragmented"):
            want = seed._make_host_page_order(
                total_pages=total, request_pages=req, pattern=pattern, seed=s
            )
            assert page_order(total, req, pattern, s) == want, (total, req, pattern, s)
            slots = seed._page_ids_to_token_slots(want, ps)
            for method in ("alloc", "alloc_contiguous_preferred"):
                theirs = getattr(
                    seed.StandaloneHostAllocator(page_size=ps, free_slots=slots.clone()), method
                )
                expected = theirs(req * ps)
                for cls in (HostAllocator, FastHostAllocator):
                    got = getattr(cls(ps, slots.clone()), method)(req * ps)
                    assert got.tolist() == expected.tolist(), (cls, total, req, pattern, method)


def test_l1_layouts_and_fifo_allocations_equal_the_seeds(seed) -> None:
    rng = random.Random(4)
    cpu = torch.device("cpu")
    cases = [(p, cp) for p in range(1, 7) for cp in range(1, 5)]  # tiny pools hit every floor
    cases += [(rng.randint(1, 64), rng.randint(1, 9)) for _ in range(60)]
    for phys, cp in cases:
        req, s = rng.randint(1, phys * cp), rng.randint(0, 50)
        for owner_pattern in ("round_robin", "single_owner", "zigzag"):
            owners = seed._make_page_compute_owners(req, cp, owner_pattern)
            assert make_page_owners(owner_pattern, req, cp) == owners
            for free_pattern in ("sequential", "owner_fragmented_later_run", "random"):
                want = seed._make_l1_free_pages(
                    physical_pages=phys, cp_size=cp, request_owners=owners,
                    pattern=free_pattern, device=cpu, seed=s,
                ).tolist()  # fmt: skip
                got = make_free_pages(
                    free_pattern, physical_pages=phys, cp_size=cp, request_owners=owners, seed=s
                ).tolist()
                assert got == want, (phys, cp, req, owner_pattern, free_pattern, s)
                theirs = seed.StandaloneCPSharedPagedAllocator(
                    physical_pages=phys, page_size=2, cp_size=cp, device=cpu
                )
                theirs.free_pages = torch.tensor(want, dtype=torch.int64)
                theirs.release_pages = torch.empty((0,), dtype=torch.int64)
                expected = theirs.alloc_pages_with_owners(owners)
                for impl in ("reference", "fast"):
                    ours = make_l1_allocator(
                        impl, physical_pages=phys, page_size=2, cp_size=cp, selector="fifo",
                        free_pages=torch.tensor(want),
                    )  # fmt: skip
                    tokens = ours.alloc_pages_with_owners(owners)
                    assert (tokens is None) == (expected is None), (impl, phys, cp, req)
                    if tokens is not None:
                        assert tokens.tolist() == torch.as_tensor(expected).tolist()
                    ours.check_integrity()
