"""Every L1 implementation against the brute-force model (tests/helpers/l1_model.py), on randomized
pools and randomized alloc/free sequences, with check_integrity() after every operation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from cpkv.alloc.l1.fast import FastL1Allocator
from cpkv.alloc.l1.fast_torch import TorchFastL1Allocator
from cpkv.alloc.l1.reference import ReferenceL1Allocator
from tests.helpers.l1_model import Model

IMPLS = {
    "reference": ReferenceL1Allocator,
    "fast": FastL1Allocator,
    "fast_torch_on_cpu": TorchFastL1Allocator,
}


@st.composite
def pools(draw):
    physical = draw(st.integers(1, 8))
    cp = draw(st.integers(1, 4))
    logical = physical * cp
    order = draw(st.permutations(range(1, logical + 1)))
    free = list(order[: draw(st.integers(0, logical))])
    return {
        "physical_pages": physical,
        "cp_size": cp,
        "page_size": draw(st.integers(1, 3)),
        "selector": draw(st.sampled_from(["fifo", "contiguous", "current"])),
        "lane_order": draw(st.sampled_from(["sorted", "as_given"])),
        "free": free,
    }


def owner_lists(cp: int, max_size: int = 12):
    valid = st.lists(st.integers(0, cp - 1), max_size=max_size)
    wild = st.lists(st.integers(-2, cp + 1), max_size=max_size)
    return st.one_of(valid, valid, valid, wild)


def build(pool: dict):
    kwargs = {k: pool[k] for k in ("physical_pages", "cp_size", "page_size", "selector")}
    kwargs["lane_order"] = pool["lane_order"]
    free = torch.tensor(pool["free"], dtype=torch.int64)
    impls = {name: cls(**kwargs, device="cpu", free_pages=free) for name, cls in IMPLS.items()}
    model = Model(
        pool["physical_pages"],
        pool["cp_size"],
        pool["page_size"],
        pool["selector"],
        pool["lane_order"],
        pool["free"],
    )
    return model, impls


def outcome(call):
    """A comparable outcome: the value (tensors as lists) or the exception type."""
    try:
        value = call()
    except ValueError:
        return "ValueError"
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


@pytest.mark.parametrize("name", list(IMPLS))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=pools(), data=st.data())
def test_fresh_pool_stats_and_selection_match_the_model(name, pool, data):
    model, impls = build(pool)
    alloc = impls[name]
    owners = data.draw(owner_lists(pool["cp_size"], max_size=3 * pool["physical_pages"]))
    target, trigger = data.draw(st.floats(0, 0.6)), data.draw(st.floats(0, 0.3))
    assert outcome(lambda: alloc.compute_owner_lane_stats(owners)) == outcome(
        lambda: model.stats(owners)
    )
    got = outcome(
        lambda: alloc.compute_owner_lane_free_room_stats(
            owners, target_ratio=target, trigger_ratio=trigger
        )
    )
    assert got == outcome(lambda: model.free_room(owners, target, trigger))
    expected = outcome(lambda: model.select(owners))
    expected_pages = expected if expected in (None, "ValueError") else expected[0]
    assert outcome(lambda: alloc.select(owners)) == expected_pages
    assert lanes_of(alloc) == model_lanes(model)  # select consumed nothing


@st.composite
def run_heavy_pools(draw):
    """Long lanes with holes and one or two owners: the contiguous selector's hard cases
    (a broken prefix, several runs, a consecutive prefix above a lower run)."""
    physical = draw(st.integers(4, 24))
    cp = draw(st.integers(1, 2))
    logical = physical * cp
    free = list(draw(st.permutations(range(1, logical + 1))))
    free = free[: draw(st.integers(logical // 2, logical))]
    if draw(st.booleans()):  # runs of the flat list ascending: prefixes often consecutive
        cut = draw(st.integers(0, len(free)))
        free = sorted(free[:cut]) + free[cut:]
    return {
        "physical_pages": physical,
        "cp_size": cp,
        "page_size": 1,
        "selector": "contiguous",
        "lane_order": draw(st.sampled_from(["sorted", "as_given"])),
        "free": free,
    }


@pytest.mark.parametrize("name", list(IMPLS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=run_heavy_pools(), data=st.data())
def test_contiguous_choice_matches_the_model(name, pool, data):
    model, impls = build(pool)
    alloc = impls[name]
    for _ in range(3):
        owner = data.draw(st.integers(0, pool["cp_size"] - 1))
        owners = [owner] * data.draw(st.integers(2, 6))
        expected = outcome(lambda o=owners: model.alloc(o))
        assert outcome(lambda o=owners: alloc.alloc_pages_with_owners(o)) == expected
        assert lanes_of(alloc) == model_lanes(model)


def model_lanes(model: Model):
    free, release = model.lanes()
    return free, release


def lanes_of(alloc):
    lanes = alloc.lanes()
    return lanes.free, lanes.release


class L1Machine(RuleBasedStateMachine):
    """Random alloc / select / stats / free sequences on every impl and the model at once."""

    @initialize(pool=pools())
    def setup(self, pool):
        self.model, self.impls = build(pool)
        self.cp = pool["cp_size"]
        self.held: list[list[int]] = []

    def all_agree(self, model_call, impl_call):
        expected = outcome(model_call)
        for name, alloc in self.impls.items():
            got = outcome(lambda a=alloc: impl_call(a))
            assert got == expected, (name, got, expected)
        return expected

    @rule(data=st.data())
    def alloc(self, data):
        owners = data.draw(owner_lists(self.cp))
        tokens = self.all_agree(
            lambda: self.model.alloc(owners), lambda a: a.alloc_pages_with_owners(owners)
        )
        if isinstance(tokens, list) and tokens:
            self.held.append(tokens)

    @rule(data=st.data())
    def select_tokens(self, data):
        owners = data.draw(owner_lists(self.cp))

        def model_tokens():
            plan = self.model.select(owners)
            return None if plan is None else self.model.tokens(plan[0])

        self.all_agree(model_tokens, lambda a: a.select_token_indices(owners))

    @rule(data=st.data(), target_ratio=st.floats(0, 0.6), trigger_ratio=st.floats(0, 0.3))
    def stats(self, data, target_ratio, trigger_ratio):
        owners = data.draw(owner_lists(self.cp))
        self.all_agree(
            lambda: self.model.stats(owners), lambda a: a.compute_owner_lane_stats(owners)
        )
        self.all_agree(
            lambda: self.model.free_room(owners, target_ratio, trigger_ratio),
            lambda a: a.compute_owner_lane_free_room_stats(
                owners, target_ratio=target_ratio, trigger_ratio=trigger_ratio
            ),
        )

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def free(self, data):
        ps = self.model.page_size
        tokens = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        pages = [tokens[i] // ps for i in range(0, len(tokens), ps)]
        chosen = data.draw(st.lists(st.sampled_from(pages), unique=True, min_size=1))
        kept = [p for p in pages if p not in chosen]
        if kept:
            self.held.append([p * ps + i for p in kept for i in range(ps)])
        give = [p * ps + i for p in chosen for i in range(ps)]
        self.all_agree(lambda: self.model.free_tokens(give), lambda a: a.free(torch.tensor(give)))

    @rule(data=st.data())
    def bad_free(self, data):
        """Freeing what is not allocated, a partial page, or a page twice: ValueError, no change."""
        ps = self.model.page_size
        logical = self.model.physical * self.cp
        page = data.draw(st.integers(1, logical))
        kind = data.draw(st.sampled_from(["page", "twice", "partial"]))
        give = [page * ps + i for i in range(ps)]
        if kind == "twice":
            give = give + give
        elif kind == "partial":
            give = give[1:] + [give[0] + ps] if ps > 1 else [page * ps, page * ps]
        if kind == "page" and page in self.model.allocated:
            return  # a legal free: the `free` rule covers those
        before = self.model.lanes()
        self.all_agree(lambda: self.model.free_tokens(give), lambda a: a.free(torch.tensor(give)))
        assert self.model.lanes() == before

    @invariant()
    def consistent(self):
        if not hasattr(self, "impls"):
            return
        for alloc in self.impls.values():
            alloc.check_integrity()
            assert lanes_of(alloc) == model_lanes(self.model)


L1Machine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_l1_random_sequences_match_the_model = L1Machine.TestCase
