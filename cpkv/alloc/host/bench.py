"""``cpkv alloc host``: time host allocator calls on the seed's free-list layouts.

Protocols (``alloc_host.protocol``):

* ``cold`` (seed 003): every sample builds a fresh allocator from a clone of the
  layout, outside the clock, and times one call. For ``op: free`` the allocation
  being freed is made untimed first.
* ``warm``: one long-lived allocator per case; every sample times an alloc, then
  times the free of what it returned, so the free list evolves as in a server. Nothing
  runs between the timed calls: ``contiguous_ratio`` comes from an untimed replay.

``alloc_host.rounds`` (default 1) runs the list of cases that many times over, each round
keeping its share of the ``repeat`` samples (warm: on a fresh allocator from the layout), and
merges every row's samples, so that a burst of noise on a shared machine lands in a few
samples of many rows rather than in all samples of one.

``ops: [mixed]`` replays one seeded alloc/free workload on every impl instead
(:mod:`cpkv.alloc.host.mixed`). When ``reference`` runs next to other impls, each row gets
``vs_reference``: the reference's p50 over this row's p50 for the same case (for mixed rows,
the ratio of total times), so speed-ups are measured side by side in one run. When both
methods run, each row gets ``vs_fifo_p50`` and ``vs_fifo_p99``: this row's p50 (p99) over the
FIFO row's p50 (p99) of the same impl and case, from the same run (the price of asking for a
contiguous selection; 1.0 on the FIFO rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cpkv.alloc.host.impls import HOST_IMPLS
from cpkv.alloc.host.layouts import free_slots
from cpkv.alloc.host.mixed import KINDS, Replay, median_replay, workload
from cpkv.alloc.host.schema import AllocHostBlock, AllocHostConfig
from cpkv.alloc.rows import (
    TABLE_COLUMNS,
    BenchIdentity,
    TimedFields,
    bench_headline,
    round_shares,
    timed_fields,
)
from cpkv.core.kinds import RunContext
from cpkv.core.timing import Stats, sample, summarize, timed
from cpkv.runs.results import RunOutput, metric

METHOD_CALLS = {"fifo": "alloc", "contiguous": "alloc_contiguous_preferred"}


@dataclass(frozen=True)
class HostBenchRow(TimedFields, BenchIdentity):
    """One op of one case: its identity, its timing (:class:`TimedFields`), its total time
    (``mixed``: the whole replay) and its speed-up over the reference."""

    total_us: float = metric(unit="us", timing=True, default=0.0)
    vs_reference: float | None = metric(unit="x", timing=True, lower_is_better=False, default=None)
    vs_fifo_p50: float | None = metric(unit="x", timing=True, default=None)
    vs_fifo_p99: float | None = metric(unit="x", timing=True, default=None)


def is_page_contiguous(selected: Any, page_size: int) -> bool:
    """Seed 003's test, restated: a non-empty selection whose pages (the first slot of each
    page, // page_size) go up by one from each page to the next."""
    if selected is None or not selected.numel():
        return False
    return bool((selected[::page_size].div(page_size, rounding_mode="floor").diff() == 1).all())


@dataclass(frozen=True)
class Case:
    impl: str
    method: str
    pattern: str
    total_pages: int
    request_pages: int


def plan(block: AllocHostBlock) -> tuple[list[Case], list[str]]:
    """The cases to run, in a fixed order, and notes on combinations that cannot run."""
    cases, notes = [], []
    if not {"alloc", "free"} & set(block.ops):
        return cases, notes
    for total in block.pool_pages():
        for req in block.request_pages:
            for pattern in block.patterns:
                for impl in block.impls:
                    for method in block.methods:
                        cases.append(Case(HOST_IMPLS.canonical(impl), method, pattern, total, req))
    runnable = []
    for case in cases:
        factory = HOST_IMPLS.get(case.impl)
        if method_supported(factory, case.method):
            runnable.append(case)
        else:
            note = f"impl {case.impl} has no {case.method} method: skipped"
            if note not in notes:
                notes.append(note)
    return runnable, notes


def method_supported(factory: Any, method: str) -> bool:
    supported = getattr(factory, "methods", METHOD_CALLS)
    return method in supported


def prepare(cfg: AllocHostConfig) -> Callable[[RunContext], RunOutput]:
    block = cfg.alloc_host
    for impl in block.impls:
        check = getattr(HOST_IMPLS.get(impl), "check_available", None)
        if check is not None:
            check()
    cases, notes = plan(block)
    mixed = mixed_plan(block, notes) if "mixed" in block.ops else []

    def execute(ctx: RunContext) -> RunOutput:
        # (case index, op) -> (samples, contiguous hits), merged over the rounds
        collected: dict[tuple[int, str], tuple[list[float], list[int]]] = {}
        steps = block.rounds * len(cases)
        for r, repeat in enumerate(round_shares(block.repeat, block.rounds)):
            layouts: dict[tuple[int, int, str], Any] = {}
            for i, case in enumerate(cases):
                what = f"{case.impl}:{case.method} {case.pattern} x{case.request_pages}"
                ctx.report(r * len(cases) + i, steps, what)
                key = (case.total_pages, case.request_pages, case.pattern)
                if key not in layouts:
                    layouts.clear()
                    layouts[key] = free_slots(
                        case.total_pages,
                        case.request_pages,
                        block.page_size,
                        case.pattern,
                        cfg.seed,
                    )
                for op, samples, hits in run_case(block, case, layouts[key], repeat):
                    kept, seen = collected.setdefault((i, op), ([], [0]))
                    kept.extend(samples)
                    seen[0] += hits
        rows = [
            make_row(block, cases[i], op, summarize(samples), hits[0])
            for (i, op), (samples, hits) in collected.items()
        ]
        for i, (total, pattern) in enumerate(mixed):
            ctx.report(i, len(mixed), f"mixed {pattern} ({total} pages)")
            base = free_slots(total, max(block.request_pages), block.page_size, pattern, cfg.seed)
            rows.extend(run_mixed(block, cfg.seed, total, pattern, base))
        ctx.report(steps, steps, "done")
        rows = with_fifo_ratios(with_ratios(rows))
        summary = {
            "cases": len(cases) + len(mixed),
            "rows": len(rows),
            "pool_pages": block.pool_pages(),
            "protocol": block.protocol if cases else "replay",  # mixed rows: their own
            "page_size": block.page_size,
            "headline": bench_headline(rows),
        }
        columns = table_columns(block)
        return RunOutput(rows=rows, summary=summary, table_columns=columns, notes=notes)

    return execute


def run_case(
    block: AllocHostBlock, case: Case, base: Any, repeat: int
) -> list[tuple[str, list[float], int]]:
    """``(op, samples in us, page-contiguous selections)`` of every op: ``repeat`` samples."""
    factory = HOST_IMPLS.get(case.impl)
    ps = block.page_size
    need = case.request_pages * ps
    call = METHOD_CALLS[case.method]
    hits = {"alloc": 0, "free": 0}
    samples: dict[str, list[float]] = {"alloc": [], "free": []}

    def fresh() -> Any:
        return factory(ps, base.clone())

    if block.protocol == "cold":
        if "alloc" in block.ops:

            def seen(alloc: Any, sel: Any) -> None:
                hits["alloc"] += is_page_contiguous(sel, ps)

            samples["alloc"] = sample(
                fresh,
                lambda a: getattr(a, call)(need),
                repeat=repeat,
                warmup=block.warmup,
                observe=seen,
            )
        if "free" in block.ops:

            def setup_free() -> tuple[Any, Any]:
                alloc = fresh()
                return alloc, getattr(alloc, call)(need)

            def seen_free(state: tuple[Any, Any], _: Any) -> None:
                hits["free"] += is_page_contiguous(state[1], ps)

            samples["free"] = sample(
                setup_free,
                lambda s: s[0].free(s[1]),
                repeat=repeat,
                warmup=block.warmup,
                observe=seen_free,
            )
    else:
        samples["alloc"], samples["free"] = run_warm(fresh(), call, need, block.warmup, repeat)
        hits["alloc"] = hits["free"] = warm_hits(fresh(), call, need, block.warmup, repeat, ps)
    return [(op, samples[op], hits[op]) for op in ("alloc", "free") if op in block.ops]


def run_warm(alloc: Any, call: str, need: int, warmup: int, repeat: int) -> tuple[list, list]:
    """The warm protocol: alloc then free on one allocator, each timed; nothing in between."""
    method, give_back = getattr(alloc, call), alloc.free
    allocs, frees = [], []
    for _ in range(warmup + repeat):
        sel, us_alloc = timed(lambda: method(need))
        _, us_free = timed(lambda s=sel: give_back(s))
        allocs.append(us_alloc)
        frees.append(us_free)
    return allocs[warmup:], frees[warmup:]


def warm_hits(alloc: Any, call: str, need: int, warmup: int, repeat: int, ps: int) -> int:
    """Page-contiguous selections of the kept warm samples, counted on an untimed replay (same
    calls, same slots), so that no torch work runs between the timed calls."""
    method, hits = getattr(alloc, call), 0
    for i in range(warmup + repeat):
        sel = method(need)
        if i >= warmup:
            hits += is_page_contiguous(sel, ps)
        alloc.free(sel)
    return hits


def make_row(block: AllocHostBlock, case: Case, op: str, stats: Stats, hits: int) -> HostBenchRow:
    return HostBenchRow(
        bench="host",
        impl=case.impl,
        method=case.method,
        op=op,
        protocol=block.protocol,
        pattern=case.pattern,
        device="cpu",
        total_pages=case.total_pages,
        request_pages=case.request_pages,
        page_size=block.page_size,
        **timed_fields(stats, hits),
        total_us=stats.mean_us * stats.n,
    )


def table_columns(block: AllocHostBlock) -> tuple[str, ...]:
    extra = ("total_us",) if "mixed" in block.ops else ()
    impls = {HOST_IMPLS.canonical(i) for i in block.impls}
    if "reference" in impls and len(impls) > 1:
        extra += ("vs_reference",)
    if {"fifo", "contiguous"} <= set(block.methods) and {"alloc", "free"} & set(block.ops):
        extra += ("vs_fifo_p50", "vs_fifo_p99")
    return TABLE_COLUMNS + extra


def with_fifo_ratios(rows: list[HostBenchRow]) -> list[HostBenchRow]:
    """Rows with ``vs_fifo_p50`` / ``vs_fifo_p99`` filled in where FIFO measured the same impl
    and case (mixed rows have no FIFO twin)."""

    def key(row: HostBenchRow) -> tuple:
        return (row.impl, row.op, row.protocol, row.pattern, row.total_pages, row.request_pages)

    fifo = {key(r): r for r in rows if r.method == "fifo" and r.op != "mixed"}
    if not any(r.method == "contiguous" and r.op != "mixed" for r in rows):
        return rows  # nothing to compare FIFO with
    out = []
    for row in rows:
        base = fifo.get(key(row)) if row.op != "mixed" else None
        if base is None or base.p50_us <= 0 or base.p99_us <= 0:
            out.append(row)
            continue
        out.append(
            replace(row, vs_fifo_p50=row.p50_us / base.p50_us, vs_fifo_p99=row.p99_us / base.p99_us)
        )
    return out


def with_ratios(rows: list[HostBenchRow]) -> list[HostBenchRow]:
    """Rows with ``vs_reference`` filled in where the reference measured the same case."""

    def key(row: HostBenchRow) -> tuple:
        return (row.method, row.op, row.protocol, row.pattern, row.total_pages, row.request_pages)

    ref = {key(r): r for r in rows if r.impl == "reference"}
    out = []
    for row in rows:
        base = ref.get(key(row))
        if base is None:
            out.append(row)
            continue
        mixed = row.op == "mixed"
        num, den = (base.total_us, row.total_us) if mixed else (base.p50_us, row.p50_us)
        out.append(replace(row, vs_reference=num / den) if den > 0 else row)
    return out


def mixed_plan(block: AllocHostBlock, notes: list[str]) -> list[tuple[int, str]]:
    """(pool pages, pattern) of each mixed workload; impls without contiguous are noted."""
    for impl in block.impls:
        if not method_supported(HOST_IMPLS.get(impl), "contiguous"):
            notes.append(
                f"impl {HOST_IMPLS.canonical(impl)} has no contiguous method: mixed skipped"
            )
    sizes = ",".join(map(str, sorted(set(block.request_pages))))
    notes.append(
        f"mixed rows: one seeded alloc/free workload of requests of {sizes} pages "
        f"(request_pages shows the largest), replayed on every impl; total_us is the whole replay's time"
    )
    return [(total, pattern) for total in block.pool_pages() for pattern in block.patterns]


def run_mixed(
    block: AllocHostBlock, seed: int, total: int, pattern: str, base: Any
) -> list[HostBenchRow]:
    """Replay one workload on every impl (the reference first, to check the others).

    The rows describe each impl's median-total replay (:func:`median_replay`).
    """
    ps, ops = block.page_size, workload(seed, block.request_pages)
    impls = [HOST_IMPLS.canonical(i) for i in block.impls]
    impls = [i for i in impls if method_supported(HOST_IMPLS.get(i), "contiguous")]
    impls.sort(key=lambda name: name != "reference")
    expected: Replay | None = None
    rows = []
    for impl in impls:
        factory = HOST_IMPLS.get(impl)
        done = median_replay(
            lambda f=factory: f(ps, base.clone()), ops, ps, is_page_contiguous,
            keep=impl == "reference" and len(impls) > 1, expected=expected,
        )  # fmt: skip
        expected = done if impl == "reference" else expected
        case = Case(impl, "all", pattern, total, max(block.request_pages))
        for kind in ("all", *KINDS):
            us = [t for k in KINDS for t in done.us[k]] if kind == "all" else done.us[kind]
            hits = sum(done.hits.values()) if kind == "all" else done.hits[kind]
            row = make_row(block, replace(case, method=kind), "mixed", summarize(us), hits)
            rows.append(replace(row, protocol="replay"))
    return rows
