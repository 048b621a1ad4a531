"""``cpkv alloc l1``: time the CP shared paged L1 allocator on seed 003's layouts.

Every case (pool size, request size, free pattern, owner pattern, impl) starts from the same
state: the free pattern's flat free list loaded into the allocator's lanes, nothing released.
Each op gets a row.  Protocols (``alloc_l1.protocol``):

* ``cold`` (seed 003): every sample builds a fresh allocator holding a copy of the case's
  state, outside the clock, and times one call.
* ``warm``: one long-lived allocator per case, so caches and allocator internals are warm;
  before every sample of ``alloc_pages`` and ``free`` the case's state is put back
  (untimed); ``stats``, ``free_room_stats`` and ``select_only`` change nothing, so their
  samples follow each other without it.

``alloc_l1.rounds`` (default 1) runs the whole list of cases that many times over, each round
keeping its share of the ``repeat`` samples, and merges every row's samples: a burst of noise
on a shared machine then lands in a few samples of many rows instead of all samples of one
(the reference and the fast impl of a case are measured apart in time).

For ``op: free`` the request is allocated untimed first, then its free is timed.  On CUDA
the device is synchronised right before the clock starts and right before it stops.
When reference and fast impls run together, every row gets ``vs_reference``: the p50 of the
``reference`` row with the same method, op, pattern and sizes over this row's p50 (as for
``cpkv alloc host``), so the speed-up is measured side by side in one run.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cpkv.alloc.l1.impls import L1_IMPLS
from cpkv.alloc.l1.layouts import make_free_pages, make_page_owners
from cpkv.alloc.l1.reference import is_selection_contiguous, make_l1_allocator, resolve_device
from cpkv.alloc.l1.schema import AllocL1Block, AllocL1Config
from cpkv.alloc.rows import (
    TABLE_COLUMNS,
    BenchIdentity,
    TimedFields,
    bench_headline,
    round_shares,
    timed_fields,
)
from cpkv.core.kinds import RunContext
from cpkv.core.timing import Stats, cuda_sync, sample, summarize
from cpkv.runs.results import RunOutput, metric


@dataclass(frozen=True)
class L1RowIdentity(BenchIdentity):
    """An L1 bench row's identity: the shared fields, then the pool's CP shape."""

    cp_size: int
    lane_order: str


@dataclass(frozen=True)
class L1BenchRow(TimedFields, L1RowIdentity):
    """One op of one case: its identity, its timing (:class:`TimedFields`), its speed-up."""

    vs_reference: float | None = metric(unit="x", timing=True, lower_is_better=False, default=None)


@dataclass(frozen=True)
class Case:
    impl: str
    physical_pages: int
    request_pages: int
    free_pattern: str
    owner_pattern: str


def plan(block: AllocL1Block) -> list[Case]:
    """The cases to run, in the seed's loop order."""
    return [
        Case(L1_IMPLS.canonical(impl), physical, request, free, owner)
        for physical in block.physical_pages
        for request in block.request_pages
        for free in block.free_patterns
        for owner in block.owner_patterns
        for impl in block.impls
    ]


def prepare(cfg: AllocL1Config) -> Callable[[RunContext], RunOutput]:
    block = cfg.alloc_l1
    device = resolve_device(block.device, "alloc_l1.device")
    cases = plan(block)

    def execute(ctx: RunContext) -> RunOutput:
        # (case index, op) -> (samples, contiguous hits), merged over the rounds
        collected: dict[tuple[int, str], tuple[list[float], list[int]]] = {}
        steps = block.rounds * len(cases)
        for r, repeat in enumerate(round_shares(block.repeat, block.rounds)):
            layouts: dict[tuple[int, int, str, str], Any] = {}
            for i, case in enumerate(cases):
                step = r * len(cases) + i
                ctx.report(step, steps, f"{case.impl} {case.free_pattern}:{case.owner_pattern}")
                key = (
                    case.physical_pages,
                    case.request_pages,
                    case.free_pattern,
                    case.owner_pattern,
                )
                if key not in layouts:
                    layouts.clear()
                    owners = make_page_owners(case.owner_pattern, case.request_pages, block.cp_size)
                    pages = make_free_pages(
                        case.free_pattern,
                        physical_pages=case.physical_pages,
                        cp_size=block.cp_size,
                        request_owners=owners,
                        seed=cfg.seed,
                    )
                    layouts[key] = (owners, pages)
                for op, samples, hits in run_case(block, case, *layouts[key], device, repeat):
                    kept, seen = collected.setdefault((i, op), ([], [0]))
                    kept.extend(samples)
                    seen[0] += hits
        ctx.report(steps, steps, "done")
        rows = [
            make_row(block, cases[i], op, str(device), summarize(samples), hits[0])
            for (i, op), (samples, hits) in collected.items()
        ]
        rows = with_speedups(rows)
        speedups = speedup_summary(rows)
        summary = {
            "cases": len(cases),
            "rows": len(rows),
            "physical_pages": list(block.physical_pages),
            "cp_size": block.cp_size,
            "page_size": block.page_size,
            "lane_order": block.lane_order,
            "protocol": block.protocol,
            "device": str(device),
            "vs_reference_p50": speedups,
            "headline": bench_headline(rows),
        }
        notes = [
            f"fast vs reference p50, {name}: median {s['median']:.2f}x "
            f"(min {s['min']:.2f}x, max {s['max']:.2f}x) over {s['cases']} cases"
            for name, s in speedups.items()
        ]
        columns = TABLE_COLUMNS + (("vs_reference",) if speedups else ())
        return RunOutput(rows=rows, summary=summary, table_columns=columns, notes=notes)

    return execute


def run_case(
    block: AllocL1Block,
    case: Case,
    owners: list[int],
    free_pages: Any,
    device: Any,
    repeat: int,
) -> list[tuple[str, list[float], int]]:
    """``(op, samples in us, contiguous selections)`` of every op: ``repeat`` kept samples."""
    import torch

    spec = L1_IMPLS.get(case.impl)
    ps, cp = block.page_size, block.cp_size

    def build(pages: Any) -> Any:
        return make_l1_allocator(
            spec.impl,
            physical_pages=case.physical_pages,
            page_size=ps,
            cp_size=cp,
            selector=spec.method,
            lane_order=block.lane_order,
            device=device,
            free_pages=pages,
        )

    state = build(free_pages).snapshot()
    empty = torch.empty((0,), dtype=torch.int64)
    warm = build(empty) if block.protocol == "warm" else None

    def fresh() -> Any:  # cold: copies, as the seed's clone; warm: shares the lane lists
        alloc = warm if warm is not None else build(empty)
        alloc.restore(state, copy=warm is None)
        return alloc

    def kept() -> Any:  # warm, read-only ops: the state never changes, nothing to put back
        return warm

    room = {"target_ratio": block.free_room_ratio, "trigger_ratio": block.free_room_trigger_ratio}
    calls: dict[str, Callable[[Any], Any]] = {
        "stats": lambda a: a.compute_owner_lane_stats(owners),
        "free_room_stats": lambda a: a.compute_owner_lane_free_room_stats(owners, **room),
        "select_only": lambda a: a.select_token_indices(owners),
        "alloc_pages": lambda a: a.alloc_pages_with_owners(owners),
    }
    measured = []
    for op in block.ops:
        hits = [0]

        def seen(tokens: Any, hits: list[int] = hits) -> None:
            pages = None if tokens is None else (tokens[::ps] // ps).tolist()
            hits[0] += is_selection_contiguous(pages, cp)

        if op == "free":
            samples = sample(
                lambda: _allocated(fresh(), owners, device),
                lambda s: s[0].free(s[1]),
                repeat=repeat,
                warmup=block.warmup,
                sync=cuda_sync(device),
                observe=lambda s, _: seen(s[1] if s[1].numel() else None),
            )
        else:
            call = calls[op]
            observe = None if op in ("stats", "free_room_stats") else (lambda _, t: seen(t))
            read_only = warm is not None and op != "alloc_pages"
            if read_only:
                warm.restore(state)
            samples = sample(
                kept if read_only else fresh,
                call,
                repeat=repeat,
                warmup=block.warmup,
                sync=cuda_sync(device),
                observe=observe,
            )
        measured.append((op, samples, hits[0]))
    return measured


def _allocated(alloc: Any, owners: list[int], device: Any) -> tuple[Any, Any]:
    """(allocator, token indices of an untimed allocation of the request; empty if None)."""
    import torch

    tokens = alloc.alloc_pages_with_owners(owners)
    if tokens is None:
        tokens = torch.empty((0,), dtype=torch.int64, device=device)
    return alloc, tokens


def make_row(
    block: AllocL1Block, case: Case, op: str, device: str, stats: Stats, hits: int
) -> L1BenchRow:
    spec = L1_IMPLS.get(case.impl)
    return L1BenchRow(
        bench="l1",
        impl=spec.impl,
        method=spec.method,
        op=op,
        protocol=block.protocol,
        pattern=f"{case.free_pattern}:{case.owner_pattern}",
        device=device,
        total_pages=case.physical_pages,
        request_pages=case.request_pages,
        page_size=block.page_size,
        cp_size=block.cp_size,
        lane_order=block.lane_order,
        **timed_fields(stats, hits),
    )


def _match(row: L1BenchRow) -> tuple[Any, ...]:
    return (row.method, row.op, row.pattern, row.total_pages, row.request_pages)


def with_speedups(rows: list[L1BenchRow]) -> list[L1BenchRow]:
    """Rows with ``vs_reference`` = reference p50 / row p50 where a reference row matches."""
    reference = {_match(r): r.p50_us for r in rows if r.impl == "reference"}
    out = []
    for row in rows:
        base = reference.get(_match(row))
        speedup = base / row.p50_us if base is not None and row.p50_us > 0 else None
        out.append(dataclasses.replace(row, vs_reference=speedup))
    return out


def speedup_summary(rows: list[L1BenchRow]) -> dict[str, dict[str, float]]:
    """Per ``op/method``: median, min and max speedup of the fast rows over the reference."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        if row.impl != "reference" and row.vs_reference is not None:
            groups.setdefault(f"{row.op}/{row.method}", []).append(row.vs_reference)
    return {
        name: {
            "median": round(statistics.median(values), 3),
            "min": round(min(values), 3),
            "max": round(max(values), 3),
            "cases": len(values),
        }
        for name, values in groups.items()
    }
