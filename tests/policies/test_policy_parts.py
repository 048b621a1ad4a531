"""cpkv's own policy parts on hand-derived cases: weighted budgets, CUDA-graph buckets, the
profiled quantile, the deadline order with aging."""

from __future__ import annotations

from dataclasses import dataclass

from cpkv.policies.budgets import TokenWeights, graph_bucket, weighted_prefill_budget, weighted_work
from cpkv.policies.deadline import INF, deadline_sort
from cpkv.policies.profiled import OutputQuantile, ProfiledSpec


def test_weighted_prefill_budget_by_hand() -> None:
    # seed 004's example: budget 6, 2 decodes, equal weights -> 4 prefill tokens
    assert weighted_prefill_budget(6, 2, 0, TokenWeights()) == 4
    # decode tokens cost 2 units: 6 - 2*2 = 2 units left -> 2 prefill tokens
    assert weighted_prefill_budget(6, 2, 0, TokenWeights(decode=2.0)) == 2
    # each decode verifies 3 drafts at 0.5: 100 - 10 - 0.5*3*10 = 75 units; prefill 1.5 a
    # token -> floor(75 / 1.5) = 50
    assert weighted_prefill_budget(100, 10, 3, TokenWeights(prefill=1.5, verify=0.5)) == 50
    # 7 units / 2 per prefill token -> 3 (floor), never rounded up past the budget
    assert weighted_prefill_budget(9, 2, 0, TokenWeights(prefill=2.0)) == 3
    # decodes alone exceed the budget: nothing left (never negative)
    assert weighted_prefill_budget(6, 8, 0, TokenWeights()) == 0
    assert weighted_work(3, 2, 0, TokenWeights(prefill=2.0)) == 8.0  # 3*2 + 2*1


def test_graph_bucket_by_hand() -> None:
    buckets = (1, 2, 4, 8, 16)
    assert graph_bucket(3, buckets) == 4  # padded by one request
    assert graph_bucket(8, buckets) == 8  # exact bucket: no padding
    assert graph_bucket(17, buckets) == 17  # above every bucket: no graph, no padding
    assert graph_bucket(5, ()) == 5


def test_profiled_quantile_by_hand() -> None:
    est = OutputQuantile(ProfiledSpec(quantile=0.5, window=4, cold_start_tokens=None))
    assert est.value() is None and est.reserve(300) == 300  # cold start: conservative
    for n in (10, 40, 20):
        est.observe(n)
    # kept [10, 20, 40]: nearest rank ceil(0.5 * 3) = 2 -> 20
    assert est.value() == 20
    assert est.reserve(15) == 15  # never more than the request's max_new
    est.observe(30)
    est.observe(50)  # window 4: 10 leaves -> [20, 30, 40, 50], rank ceil(2) = 2 -> 30
    assert est.value() == 30
    q9 = OutputQuantile(ProfiledSpec(quantile=0.9, window=10, cold_start_tokens=7))
    assert q9.reserve(100) == 7  # the cold-start value
    for n in range(1, 11):
        q9.observe(n * 10)
    assert q9.value() == 90  # rank ceil(0.9 * 10) = 9 -> the 9th smallest, 90
    q0 = OutputQuantile(ProfiledSpec(quantile=0.0))
    q0.observe(5)
    q0.observe(3)
    assert q0.value() == 3  # quantile 0: the smallest


@dataclass
class R:
    index: int
    arrival_us: float
    deadline_us: float


def test_deadline_order_with_aging_by_hand() -> None:
    queue = [R(0, 0.0, 9000.0), R(1, 100.0, 500.0), R(2, 200.0, INF), R(3, 300.0, 500.0)]
    # at t=1000, aging 5000: nobody aged -> by deadline (500, 500, 9000, inf), ties by arrival
    deadline_sort(queue, 1000.0, 5000.0)
    assert [r.index for r in queue] == [1, 3, 0, 2]
    # at t=5150: requests 0 (waited 5150) and 1 (5050) are aged -> first, oldest first; then 3
    # (deadline 500), 2 (no deadline)
    deadline_sort(queue, 5150.0, 5000.0)
    assert [r.index for r in queue] == [0, 1, 3, 2]
    # at t=5200 request 2 ages too and passes request 3 despite having no deadline
    deadline_sort(queue, 5200.0, 5000.0)
    assert [r.index for r in queue] == [0, 1, 2, 3]
