"""The steady-state loop (:mod:`cpkv.serving.decode_stretch`) takes the iterations it claims
and gives the general loop's results for them: a queue of several new requests admitted
whole in one iteration, the queue the pass would cut (left to the general iteration), and a
lone arrival followed by its stretch."""

from __future__ import annotations

import pytest

from cpkv.serving import loop as loop_module
from cpkv.serving.adder import AdderBudgets
from cpkv.serving.cost.model import CostModel
from cpkv.serving.loop import SimSettings, simulate
from cpkv.serving.metrics import request_lines
from cpkv.serving.workload import ServingRequest

SETTINGS = SimSettings(
    block_size=4,
    capacity_blocks=400,
    adder=AdderBudgets(4, 256, 64),
    cost=CostModel(1000.0, 5.0, 20.0, 0.5, 1024, None),
)


def _general_iterations(monkeypatch, requests, settings) -> tuple[int, object]:
    """How many iterations took the loop's general path, and the run."""
    calls = []
    original = loop_module.Sim._iteration

    def counted(self):
        calls.append(self.iterations)
        return original(self)

    monkeypatch.setattr(loop_module.Sim, "_iteration", counted)
    res = simulate(requests, settings)
    return len(calls), res


def _same_as_the_general_loop(requests, settings, res) -> None:
    slow = simulate(requests, settings, events=True)  # events: every iteration the general way
    assert request_lines(res) == request_lines(slow)
    assert res.timeline == slow.timeline and res.end_us == slow.end_us
    assert res.counters == {**slow.counters}


def test_three_arrivals_together_are_admitted_in_one_straight_line_iteration(monkeypatch) -> None:
    # r0 runs alone; r1..r3 arrive together while it decodes: SGLang's pass admits all three
    # whole (prompts of 20 tokens, a chunk budget of 64 minus the one decode token), so the
    # iteration that admits them is the straight-line one: no general iteration at all
    requests = [ServingRequest("r0", 0.0, 20, 30)] + [
        ServingRequest(f"r{k}", 5.0, 20, 6 + k) for k in (1, 2, 3)
    ]
    general, res = _general_iterations(monkeypatch, requests, SETTINGS)
    assert general == 0
    admitted = {r.rid: r.admitted_us for r in res.requests}
    assert admitted["r1"] == admitted["r2"] == admitted["r3"] > admitted["r0"]
    assert res.counters["admissions"] == 4 and res.counters["first_tokens"] == 4
    _same_as_the_general_loop(requests, SETTINGS, res)


def test_a_queue_the_pass_would_cut_goes_the_general_way(monkeypatch) -> None:
    # three prompts of 30 tokens against a chunk budget of 64: the pass admits two and cuts
    # the third into a chunk, which only the general iteration does
    requests = [ServingRequest("r0", 0.0, 20, 30)] + [
        ServingRequest(f"r{k}", 5.0, 30, 8) for k in (1, 2, 3)
    ]
    general, res = _general_iterations(monkeypatch, requests, SETTINGS)
    assert general >= 1
    _same_as_the_general_loop(requests, SETTINGS, res)


@pytest.mark.parametrize("linear", [True, False])
def test_a_lone_arrival_and_its_stretch_match_the_general_loop(monkeypatch, linear) -> None:
    # requests arriving one at a time (never two waiting): after the first admission every
    # iteration is straight-line; the roofline-like path (no inline linear costs) logs its
    # durations and must agree too
    requests = [ServingRequest(f"r{k}", 40.0 * k, 12 + k, 10 + 3 * k) for k in range(6)]
    if not linear:
        monkeypatch.setattr(loop_module, "linear_costs", lambda cost: None)
    general, res = _general_iterations(monkeypatch, requests, SETTINGS)
    assert general == 0
    assert res.iterations > len(requests)  # decode stretches ran
    _same_as_the_general_loop(requests, SETTINGS, res)
