"""Differential test: cpkv.sglang against the real SGLang 0.5.23 scheduler loop, iteration by
iteration.

Seeded random scenarios (``scenarios.py``: queues larger than one batch, shared prefixes between
waiting and running requests, long chunked prompts beside decodes, pools so small that decode
retracts, bursts and gaps, ``ignore_eos``; the normal and the overlap loop, mixed chunk on and
off, the radix cache on and off, page sizes 1 to 16, ``fcfs``, ``lof``, ``lpm``, ``hrrn``, ``shortest-prefill-first`` and
``dfs-weight``, priority
scheduling and
preemption) run through the real
loop (``oracle.py``: the shared driver, one subprocess) and through the model; every field of
every iteration (batch kind, extend rows, decode rows, the chunked request, retractions,
priority preemptions, the new-token ratio, free slots, evictable and protected tree tokens, queue and batch sizes), every
request's first-token, last-token and finish time and output length, and the final state must
be equal. Needs sglang (the venv of ``scripts/oracle_venv.sh``) and ``../shared``; skips without
them.
"""

from __future__ import annotations

import pytest

from cpkv.sglang import run_scenario
from tests.differential import below_floors, differing, side_by_side
from tests.sglang_loop import oracle
from tests.sglang_loop.scenarios import make_scenarios

NUM_SCENARIOS = 500
SEED = 0

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(oracle.missing() is not None, reason=oracle.missing() or ""),
]


@pytest.fixture(scope="module")
def runs() -> list[tuple[dict, dict, dict]]:
    return side_by_side(make_scenarios(NUM_SCENARIOS, SEED), run_scenario, oracle.run_real)


def test_every_iteration_matches_the_real_loop(runs):
    report = differing(runs, oracle.compare)
    assert not report, report


def test_the_scenarios_exercise_the_rules(runs):
    cov = oracle.coverage([s for s, _, _ in runs], [r for _, _, r in runs])
    floors = {
        "retraction": 40,
        "priority_preemption": 10,
        "readmitted_after_retraction": 30,
        "prefix_hit": 100,
        "eviction": 40,
        "chunked": 100,
        "mixed_batch": 60,
        "prefill_stalls_decodes": 100,
        "no_token_latch": 30,
        "overlap": 200,
        "page_size_over_1": 150,
        "radix_off": 100,
        "ignore_eos": 40,
        "hrrn_reorders": 20,
        "shortest_prefill_first_reorders": 10,
        "dfs_weight_reorders": 10,
        "idle_gap": 100,
    }
    report = below_floors(cov, floors)
    assert not report, report
