"""The model's running tallies and its released-node queue.

The model counts loads, evictions, continuations and decisions as it runs (so that a
100,000-request summary does not read every record back): the tallies must equal what the
records say. Released L1 nodes are a queue in evaluation order; an out-of-order release
must still be evicted oldest evaluation first, leaf first.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.admission.adder import PrefillAdderModel
from cpkv.admission.budgets import AdmitBudgets, CpBudgets
from cpkv.admission.records import count_records, summarize
from cpkv.admission.scenarios import random_scenario
from cpkv.admission.ticks import run_admission
from cpkv.workload.request import Request


def passes(model: PrefillAdderModel, release: bool) -> tuple:
    ticks = []
    while model.has_work():
        record = model.run_pass(len(ticks))
        ticks.append(record)
        if not record.accepted:
            break
        if release:
            model.release_finished()
    return tuple(ticks)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.booleans())
def test_tallies_equal_the_records(seed, cp):
    sc = random_scenario(seed, cp=cp, max_requests=30)
    model = PrefillAdderModel(sc.requests, sc.budgets)
    ticks = passes(model, sc.budgets.release_each_tick)
    counted = count_records(ticks)
    assert model.counts() == counted
    result = run_admission(sc.requests, sc.budgets)  # the summary from the tallies...
    assert result.summary == summarize("model", len(sc.requests), result.ticks)  # ...and records


def test_tallies_by_hand():
    # r0 loads 100 of 150 free; r1 needs 100 with 50 free: evicts r2's 30-token prefix, then
    # r0's released node (100), loads; r2 then loads its 30 tokens (now all L2) with no eviction
    reqs = [Request("r0", 0, 100, 1), Request("r1", 0, 100, 1), Request("r2", 30, 0, 1)]
    b = AdmitBudgets(
        available_tokens=150, prefill_max_requests=1, release_each_tick=True, max_new_tokens=0,
        cp=CpBudgets(enabled=False),
    )  # fmt: skip
    c = run_admission(reqs, b).summary
    assert (c.requests_admitted, c.load_backs, c.loaded_tokens, c.evicted_tokens) == (
        3,
        3,
        230,
        130,
    )
    # each of the first two passes also refuses the next request (prefill_max_requests)
    assert (c.ticks, c.load_backs_declined, c.chunk_continuations, c.decisions) == (3, 0, 0, 5)


def test_chunk_continuations_are_counted():
    # chunk 100: r0 (250 new tokens) runs as 100 + 100 + 50, one decision per pass
    b = AdmitBudgets(available_tokens=10_000, chunked_prefill_size=100)
    s = run_admission([Request("r0", 0, 0, 250)], b).summary
    assert (s.ticks, s.chunk_continuations, s.requests_admitted, s.decisions) == (3, 2, 1, 3)


def evict_order(model: PrefillAdderModel, need: int) -> list[int]:
    """Node sizes evicted one by one until ``need`` tokens are free."""
    out = []
    while need > 0 and model.released:
        before = model.released_tokens
        model._evict_released(1)
        out.append(before - model.released_tokens)
        need -= out[-1]
    return out


def test_out_of_order_release_is_evicted_in_evaluation_order():
    reqs = [Request(f"r{k}", 10 * (k + 1), 5 * (k + 1), 1) for k in range(4)]
    model = PrefillAdderModel(reqs, AdmitBudgets(release_each_tick=True))
    # (request, evaluation stamp, L1 prefix held, tokens loaded): r2 finishes before r1
    model.finished = [(0, 1, 10, 5), (2, 3, 30, 15)]
    model.release_finished()
    # r3 lost its 40-token L1 prefix before admission and loaded all 60 tokens back: its
    # original two nodes (20 L2, 40 L1) are released, leaf first
    model.finished = [(1, 2, 20, 0), (3, 4, 0, 60)]
    model.release_finished()
    assert list(model.released) == [(1, 5), (1, 10), (2, 20), (3, 15), (3, 30), (4, 20), (4, 40)]
    assert model.released_tokens == 5 + 10 + 20 + 15 + 30 + 20 + 40
    assert evict_order(model, 36) == [5, 10, 20, 15]  # whole nodes: 50 tokens for 36
