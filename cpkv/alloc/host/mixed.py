"""``ops: [mixed]``: one alloc/free workload, generated in advance, replayed on every impl.

The workload is drawn from the config's seed before anything runs: ``MIXED_OPS`` operations,
``FREE_SHARE`` of them frees of a held block (which one is drawn too), the rest allocations of
one of ``request_pages`` pages, ``FIFO_SHARE`` of them FIFO and the others
contiguous-preferred. Every impl replays the same list ``MIXED_REPLAYS`` times, each time on a fresh
allocator over the same layout, each call timed on its own; the replay with the median total
time is reported (one 4 ms scheduler tick on a shared machine is a quarter of a fast impl's
whole replay). A free with nothing held is skipped (by every impl alike, since their
selections are the same). One more replay first, with its times dropped, does the checks, so
that the timed ones run only their own bookkeeping between calls: it counts page-contiguous
selections and, when the reference runs too, compares every selection and the final free
list of the other impls with the reference's (a difference stops the run).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cpkv.core.timing import timed

MIXED_OPS = 600
MIXED_REPLAYS = 3
FREE_SHARE = 0.45
FIFO_SHARE = 0.15
KINDS = ("contiguous", "fifo", "free")


@dataclass(frozen=True)
class MixedOp:
    kind: str  # contiguous | fifo | free
    pages: int = 0  # request size of an allocation
    pick: float = 0.0  # which held block a free returns: a fraction of the held list


def workload(seed: int, request_pages: Sequence[int], n_ops: int = MIXED_OPS) -> list[MixedOp]:
    """The operations, a function of ``seed`` and ``request_pages`` only."""
    rng = random.Random(f"cpkv.alloc_host.mixed:{seed}")
    ops = []
    for _ in range(n_ops):
        if rng.random() < FREE_SHARE:
            ops.append(MixedOp("free", pick=rng.random()))
        else:
            kind = "fifo" if rng.random() < FIFO_SHARE else "contiguous"
            ops.append(MixedOp(kind, pages=rng.choice(list(request_pages))))
    return ops


class ReplayMismatch(RuntimeError):
    """An impl's selection or free list differs from the reference's in the mixed workload."""


@dataclass
class Replay:
    """Per-kind call times (us) and page-contiguous counts of one replay."""

    us: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    selections: list[Any] = field(default_factory=list)  # kept copies, when asked for
    free_list: list[int] | None = None

    @property
    def total_us(self) -> float:
        return sum(sum(times) for times in self.us.values())


def median_replay(
    make: Callable[[], Any],
    ops: Sequence[MixedOp],
    page_size: int,
    contiguous: Callable[[Any, int], bool],
    *,
    keep: bool = False,
    expected: Replay | None = None,
    times: int = MIXED_REPLAYS,
) -> Replay:
    """One checked replay, then ``times`` timed ones, each on a fresh allocator from ``make()``.

    The checked replay counts the page-contiguous selections, keeps copies of them when
    ``keep`` and compares them with ``expected`` op by op when given; its times are dropped.
    Returns the median-total timed replay, with the checked replay's counts, copies and free
    list.
    """
    checked = replay(make(), ops, page_size, contiguous, keep=keep, expected=expected)
    runs = sorted((replay(make(), ops, page_size) for _ in range(times)), key=lambda r: r.total_us)
    median = runs[len(runs) // 2]
    median.hits, median.selections = checked.hits, checked.selections
    median.free_list = checked.free_list
    return median


def replay(
    alloc: Any,
    ops: Sequence[MixedOp],
    page_size: int,
    contiguous: Callable[[Any, int], bool] | None = None,
    *,
    keep: bool = False,
    expected: Replay | None = None,
) -> Replay:
    """Run ``ops`` on ``alloc``, each call timed on its own.

    With ``contiguous``, count the page-contiguous selections; with ``keep``, keep copies of
    the selections; with ``expected``, check them against another replay's.
    """
    out, held, n_alloc = Replay(), [], 0
    for i, op in enumerate(ops):
        if op.kind == "free":
            if not held:
                continue
            block = held.pop(min(int(op.pick * len(held)), len(held) - 1))
            _, us = timed(lambda b=block: alloc.free(b))
            sel = block
        else:
            call = alloc.alloc if op.kind == "fifo" else alloc.alloc_contiguous_preferred
            sel, us = timed(lambda c=call, n=op.pages * page_size: c(n))
            if expected is not None:
                _check(sel, expected.selections[n_alloc], i, alloc)
            if keep:
                out.selections.append(None if sel is None else sel.clone())
            n_alloc += 1
            if sel is not None and op.pages:  # request sizes are whole pages: not empty
                held.append(sel)
        out.us[op.kind].append(us)
        if contiguous is not None:
            out.hits[op.kind] += contiguous(sel, page_size)
    if keep or expected is not None:
        out.free_list = alloc.free_slot_list()
    if expected is not None and out.free_list != expected.free_list:
        raise ReplayMismatch(
            f"mixed workload: impl {_name(alloc)}'s final free list differs from the reference's"
        )
    return out


def _check(got: Any, want: Any, i: int, alloc: Any) -> None:
    import torch

    same = got is None if want is None else got is not None and torch.equal(got, want)
    if not same:
        raise ReplayMismatch(
            f"mixed workload: impl {_name(alloc)} selected differently from the reference at op {i}"
        )


def _name(alloc: Any) -> str:
    return getattr(alloc, "name", type(alloc).__name__)
