"""Differential test: cpkv.vllm against the real vLLM 0.32.0 V1 scheduler, step by step.

1050 seeded random scenarios (``scenarios.py``: shared prefixes, tiny pools forcing preemption
and re-admission with cached blocks, long prompts under the long-prefill cap, priority,
``max_num_seqs`` limits, bursts, a mixed family of 20 to 50 requests) run through the real scheduler (``oracle.py``: the shared
driver, one subprocess) and through the model; every recorded field of every step and every
request's summary must be equal. Needs vllm (the venv of ``scripts/vllm_venv.sh``) and
``../shared``; skips without them.
"""

from __future__ import annotations

import pytest

from cpkv.vllm import run_scenario
from tests.differential import below_floors, differing, side_by_side
from tests.vllm import oracle
from tests.vllm.scenarios import make_scenarios

NUM_SCENARIOS = 1050
SEED = 0

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(oracle.missing() is not None, reason=oracle.missing() or ""),
]


@pytest.fixture(scope="module")
def runs() -> list[tuple[dict, dict, dict]]:
    return side_by_side(make_scenarios(NUM_SCENARIOS, SEED), run_scenario, oracle.run_real)


def test_every_step_matches_the_real_scheduler(runs):
    report = differing(runs, oracle.compare)
    assert not report, report


def test_the_scenarios_exercise_the_rules(runs):
    cov = oracle.coverage([s for s, _, _ in runs], [r for _, _, r in runs])
    floors = {
        "preemption": 60,
        "resumed_with_hit": 30,
        "resumed_without_hit": 10,
        "prefix_hit_new": 100,
        "stop_kv_blocks": 60,
        "stop_token_budget": 60,
        "stop_max_num_seqs": 30,
        "chunked": 60,
        "priority": 100,
        "no_prefix_caching": 40,
        "idle_step": 100,
        "self_preemption_empty_step": 3,
        "several_victims_one_step": 3,
        "max_model_len_stop": 20,
    }
    report = below_floors(cov, floors)
    assert not report, report
