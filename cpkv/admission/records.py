"""Result records of an admission run: one row per tick, load-back events, a summary.

Every field except those named ``*_us`` is deterministic: the same requests and budgets give
byte-identical records on every run and on both backends (``model`` and ``sglang``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from cpkv.core.fastinit import fast_constructor

NO_TOKEN: Final = "NO_TOKEN"
OTHER: Final = "OTHER"
BATCH_FULL: Final = "batch_full"
QUEUE_EXHAUSTED: Final = "queue_exhausted"
STOP_RESULTS = (NO_TOKEN, OTHER, BATCH_FULL, QUEUE_EXHAUSTED)
"""``stopped_result``: SGLang's ``AddReqResult`` names, or why the scan ran out of requests."""

STOP_WHERE = ("refused", "after_admit", "scan_top", "batch_full", "queue_exhausted")
"""``stopped_where``: a candidate was refused by ``add_one_req``; a request was admitted but
``budget_state()`` then said stop; the budget check at the top of the scan (after a continuing
chunk) said ``OTHER``; the batch was full; or no request was left."""

BUDGETS = (
    "rem_total_tokens",
    "cur_rem_tokens",
    "rem_input_tokens",
    "rem_chunk_tokens",
    "prefill_max_requests",
    "max_running_requests",
    "cp_max_total_extend_tokens",
    "cp_max_total_cached_tokens",
    "cp_max_batch_requests",
)
"""``stopped_budget``: the exact budget that stopped a scan (``None`` when the queue ran out)."""


@dataclass(frozen=True)
class AcceptedRequest:
    """One request in a tick's batch.

    ``prefix_tokens`` is SGLang's ``prefix_len`` at commit (L1 prefix plus the L2 tokens
    loaded back; for a continuing chunk, the tokens earlier chunks computed) and
    ``extend_tokens`` the tokens computed in this pass. ``chunked``: the prompt is not
    finished after this pass. ``continuation``: a continuing chunk (``add_chunked_req``).
    """

    rid: str
    prefix_tokens: int
    extend_tokens: int
    chunked: bool = False
    continuation: bool = False
    host_hit_tokens: int = 0
    loaded_tokens: int = 0


@dataclass(frozen=True)
class LoadBackEvent:
    """One L2 -> L1 load-back attempt (all or nothing).

    ``requested_tokens`` is the host hit; ``paged_tokens`` the L1 slots it needs (page
    aligned); ``loaded_tokens`` 0 or ``paged_tokens``; ``evicted_tokens`` the unlocked L1 cache
    evicted to make room (least recently used first). ``outcome``: ``loaded``,
    ``below_threshold``, ``over_quota`` or ``no_room``.
    """

    rid: str
    requested_tokens: int
    paged_tokens: int
    loaded_tokens: int
    quota_tokens: int | None
    available_before_tokens: int
    available_after_tokens: int
    evicted_tokens: int
    outcome: str


@dataclass(frozen=True)
class TickRecord:
    """One scheduling pass: what it admitted, what stopped it, and the budgets it left."""

    tick: int
    accepted: tuple[AcceptedRequest, ...]
    stopped_on_rid: str | None
    stopped_result: str
    stopped_budget: str | None
    stopped_where: str
    log_hit_tokens: int
    log_input_tokens: int
    cp_total_extend_tokens: int
    cp_total_cached_tokens: int
    cp_batch_requests: int
    allocator_available_after_tick: int
    evictable_after_tick: int
    load_back_events: tuple[LoadBackEvent, ...]
    rem_total_tokens: int | float
    cur_rem_tokens: int
    rem_input_tokens: int
    rem_chunk_tokens: int | None
    decisions: int
    duration_us: float = 0.0


@dataclass(frozen=True)
class AdmitSummary:
    """Totals over a run. ``decisions`` counts ``add_one_req`` and ``add_chunked_req`` calls."""

    backend: str
    ticks: int
    requests: int
    requests_admitted: int
    requests_waiting: int
    chunk_continuations: int
    decisions: int
    load_backs: int
    loaded_tokens: int
    load_backs_declined: int
    evicted_tokens: int
    stops_by_result: dict[str, int]
    stops_by_budget: dict[str, int]
    duration_us: float = 0.0


@dataclass(frozen=True)
class AdmitResult:
    """The ticks of one run and their summary."""

    ticks: tuple[TickRecord, ...]
    summary: AdmitSummary


new_accepted = fast_constructor(AcceptedRequest)
new_load_back_event = fast_constructor(LoadBackEvent)
new_tick = fast_constructor(TickRecord)


@dataclass(frozen=True)
class RunCounts:
    """What a run did, summed over its ticks (``admitted`` excludes chunk continuations)."""

    admitted: int
    continuations: int
    decisions: int
    load_backs: int
    loaded_tokens: int
    declined: int
    evicted_tokens: int


def count_records(ticks: tuple[TickRecord, ...]) -> RunCounts:
    """Count the accepted requests and load-back events of every tick."""
    accepted = continuations = decisions = 0
    loads = loaded = declined = evicted = 0
    for t in ticks:
        accepted += len(t.accepted)
        for a in t.accepted:
            continuations += a.continuation
        decisions += t.decisions
        for e in t.load_back_events:
            evicted += e.evicted_tokens
            if e.loaded_tokens:
                loads += 1
                loaded += e.loaded_tokens
            else:
                declined += 1
    return RunCounts(
        accepted - continuations, continuations, decisions, loads, loaded, declined, evicted
    )


def summarize(
    backend: str, requests: int, ticks: tuple[TickRecord, ...], counts: RunCounts | None = None
) -> AdmitSummary:
    """Count what the ticks did (the same code for every backend).

    ``counts``: tallies the backend kept while it ran, equal to :func:`count_records` of the
    ticks (the model keeps them: on 100,000 requests, reading every record back costs more
    than counting as it goes); without them the records are counted.
    """
    c = count_records(ticks) if counts is None else counts
    by_result: dict[str, int] = {}
    by_budget: dict[str, int] = {}
    for t in ticks:
        by_result[t.stopped_result] = by_result.get(t.stopped_result, 0) + 1
        if t.stopped_budget is not None:
            by_budget[t.stopped_budget] = by_budget.get(t.stopped_budget, 0) + 1
    return AdmitSummary(
        backend=backend,
        ticks=len(ticks),
        requests=requests,
        requests_admitted=c.admitted,
        requests_waiting=requests - c.admitted,
        chunk_continuations=c.continuations,
        decisions=c.decisions,
        load_backs=c.load_backs,
        loaded_tokens=c.loaded_tokens,
        load_backs_declined=c.declined,
        evicted_tokens=c.evicted_tokens,
        stops_by_result=dict(sorted(by_result.items())),
        stops_by_budget=dict(sorted(by_budget.items())),
        duration_us=sum(t.duration_us for t in ticks),
    )
