"""A token budget that runs out along the prefilling requests: the lane's share
(:func:`~cpkv.serving.schedulers.blocks.lane_share`) against the rule written out request by
request, and whole runs whose lane holds the tail against runs that write a row for every
request the budget reaches."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from cpkv.serving.engine import engine as engine_module
from cpkv.serving.model.prefill_lane import PrefillLane
from cpkv.serving.model.request import Req
from cpkv.serving.schedulers import blocks
from tests.serving.engine.test_stretch import same_decisions, settings, workload


def walked(lefts: list[int], chunk: int, budget: int) -> list[int]:
    """Tokens each request computes, in order: ``min(left, chunk, budget left)`` while the
    budget is positive (the definition)."""
    out = []
    for left in lefts:
        take = min(left, chunk, budget) if budget > 0 else 0
        budget -= take
        out.append(take)
    return out


def lane_of(lefts: list[int], chunk: int, steps: int) -> tuple[PrefillLane, list[Req]]:
    """A lane ``steps`` uniform steps on whose members have ``lefts`` tokens left."""
    lane, members = PrefillLane(chunk), []
    for k, left in enumerate(lefts):
        r = Req(k, f"r{k}", 0.0, 4096, 1)
        r.stamp, r.fill_tokens, r.filled_tokens = 10 + 3 * k, 4096, 4096 - left - chunk * steps
        lane.join(r)
        members.append(r)
    lane.advance(steps)
    return lane, members


@hyp_settings(max_examples=400, deadline=None)
@given(
    lefts=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    chunk=st.integers(1, 12),
    budget=st.integers(-5, 400),
    steps=st.integers(0, 3),
)
def test_the_lane_share_is_the_rule_request_by_request(lefts, chunk, budget, steps):
    lane, members = lane_of(lefts, chunk, steps)
    reached, partial, completing, left = blocks.lane_share(lane, members, budget)
    want = walked(lefts, chunk, budget)
    whole = [min(x, chunk) for x in lefts]
    assert want[:reached] == whole[:reached]
    if reached < len(lefts):
        assert want[reached] == partial < whole[reached]
        assert not any(want[reached + 1 :])
    else:
        assert partial == 0
    assert completing == sum(t >= x for t, x in zip(want[:reached], lefts, strict=False))
    if budget <= 0:
        assert (reached, partial, completing, left) == (0, 0, 0, budget)
    else:
        assert left == (budget - sum(want) if reached == len(lefts) else 0)


def count_held(monkeypatch) -> list[int]:
    """The ``held`` of every uniform plan the engine applies (recorded as it runs)."""
    seen: list[int] = []
    original = engine_module.Engine._apply

    def recorded(self, plan):
        if plan.uniform:
            seen.append(plan.held)
        return original(self, plan)

    monkeypatch.setattr(engine_module.Engine, "_apply", recorded)
    return seen


@pytest.mark.parametrize("policy", ["iteration", "optimistic", "conservative"])
def test_a_held_tail_decides_as_rows_for_every_request(policy, monkeypatch):
    # small chunks, a budget that many prefilling requests share: it runs out among them
    s = replace(settings(policy), chunk_tokens=4, budget_tokens=160, capacity_blocks=2000)
    requests = workload(300, 0.4, (64, 256), (8, 64), seed=3)
    held = count_held(monkeypatch)
    lane_tail = same_decisions(requests, s)[0]
    assert sum(h > 0 for h in held) > 50  # the tail was held, in many iterations
    monkeypatch.setattr(blocks, "lane_share", lambda lane, prefilling, budget: (0, 0, 0, 0))
    held.clear()
    rows = same_decisions(requests, s)[0]
    assert not any(held)
    assert lane_tail.iterations == rows.iterations
    assert lane_tail.counters == rows.counters
    for a, b in zip(lane_tail.requests, rows.requests, strict=True):
        assert (a.rid, a.state, a.generated, a.prefilled, a.preemptions) == (
            b.rid, b.state, b.generated, b.prefilled, b.preemptions,
        )  # fmt: skip
        assert (a.first_token_us, a.finished_us) == pytest.approx(
            (b.first_token_us, b.finished_us), rel=1e-9
        )


@hyp_settings(max_examples=200, deadline=None)
@given(st.integers(0, 80), st.data())
def test_removing_completed_requests_keeps_admission_order(size, data):
    """Short lists (scanned) and long ones (bisected on the stamps) lose exactly the requests
    gone, the others staying in admission order."""
    from cpkv.serving.model.prefill_lane import SCAN_UP_TO, remove_in_order

    requests = []
    for k in range(size):
        r = Req(k, f"r{k}", 0.0, 64, 1)
        r.stamp = 5 + 2 * k
        requests.append(r)
    gone = data.draw(st.lists(st.sampled_from(requests), unique=True) if requests else st.just([]))
    kept = [r for r in requests if all(r is not g for g in gone)]
    remove_in_order(requests, gone)
    assert [r.rid for r in requests] == [r.rid for r in kept]
    assert SCAN_UP_TO < 80  # (both ways drawn)
