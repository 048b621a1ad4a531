"""Differential suite: cpkv's PrefillAdder model against the REAL sglang 0.5.23 PrefillAdder.

Every scenario runs through both backends (``model`` and ``sglang``, CP limits off: upstream
has none) and every tick must agree on every field but ``duration_us``: the accepted requests
with their prefix and extend lengths, chunk flags and loaded L2 tokens, the stop (request,
result, budget, where), the budgets left, the log counters, the allocator and evictable
sizes, and each load-back event. Scenarios are seeded (:mod:`cpkv.admission.scenarios`): pages of
1/16/64, chunking on/off, L1 and L2 hits, running decodes, tight memory with evictions,
max_running_requests, prefill_max_requests, release_each_tick, multi-tick runs with chunk
continuation.

It needs sglang (run it with the oracle venv's python, as .ci/run does with ``-m sglang``);
without it the whole module is skipped with a loud reason and a warning.
"""

from __future__ import annotations

import json

import pytest

from cpkv.admission.budgets import AdmitBudgets, CpBudgets
from cpkv.admission.scenarios import random_scenario
from cpkv.admission.ticks import run_admission
from cpkv.core.schema import to_dict
from cpkv.workload.request import Request
from tests.helpers.sglang_suite import load_or_skip, sglang_marks

SCENARIOS = 320
LARGE_SCENARIOS = 40
SKIP = (
    "SGLANG NOT IMPORTABLE: the differential suite (model vs the real sglang PrefillAdder, "
    f"{SCENARIOS + LARGE_SCENARIOS} random scenarios and the hand-made ones) DID NOT RUN. Run it with a python that has "
    "sglang, e.g. the oracle venv of ../shared/oracle/setup_oracle_venv.sh: "
    "<venv>/bin/python -m pytest -m sglang tests/admission/test_differential.py"
)
pytestmark = sglang_marks(SKIP)


@pytest.fixture(scope="module", autouse=True)
def _real_sglang():
    """Import sglang once for the whole module (about 7 s); skip loudly if it fails."""
    load_or_skip(SKIP)


def ticks(requests, budgets, backend):
    out = []
    for t in run_admission(requests, budgets, backend).ticks:
        row = to_dict(t)
        del row["duration_us"]
        out.append(json.dumps(row))  # JSON: 295 and 295.0 differ
    return out


def assert_same(requests, budgets, label):
    model = ticks(requests, budgets, "model")
    real = ticks(requests, budgets, "sglang")
    for k, (m, r) in enumerate(zip(model, real, strict=False)):
        if m != r:
            m, r = json.loads(m), json.loads(r)
            diff = {key: (m[key], r[key]) for key in m if m[key] != r[key]}
            pytest.fail(f"{label}: tick {k} differs (model, sglang): {diff}")
    assert len(model) == len(real), f"{label}: {len(model)} ticks (model) vs {len(real)} (sglang)"


def _by_page(seeds, **kw):
    # grouped by page size: the real backend rebuilds its ServerArgs when the page changes
    return sorted(seeds, key=lambda s: random_scenario(s, **kw).budgets.page_size)


@pytest.mark.parametrize("seed", _by_page(range(SCENARIOS)))
def test_random_scenario(seed):
    sc = random_scenario(seed)
    assert_same(sc.requests, sc.budgets, f"seed {seed}")


@pytest.mark.parametrize("seed", _by_page(range(10_000, 10_000 + LARGE_SCENARIOS), max_requests=40))
def test_large_random_scenario(seed):
    sc = random_scenario(seed, max_requests=40)
    assert_same(sc.requests, sc.budgets, f"seed {seed} (large)")


R = Request
HAND_CASES = {  # the hand-derived cases of test_admit_model / test_admit_evict, on the real thing
    "device_hit": ([R("r0", 512, 0, 188, 32), R("r1", 0, 0, 200, 32)], {"available_tokens": 3584}),
    "l1_and_l2": ([R("r0", 256, 144, 100, 50)], {"available_tokens": 1792}),
    "ragged_pages": ([R("r0", 20, 30, 10, 0)], {"page_size": 16, "available_tokens": 1024}),
    "whole_l2_first_chunk": ([R("r0", 0, 400, 600, 10)], {"available_tokens": 4096, "chunked_prefill_size": 256}),
    "three_ticks": ([R("big", 0, 0, 2500, 64), R("small", 0, 0, 300, 64)], {"available_tokens": 8192, "chunked_prefill_size": 1000}),
    "borrowed_prefix": ([R("r_big", 0, 0, 140, 0), R("r1", 100, 0, 10, 0)], {"available_tokens": 50}),
    "evict_other": ([R("r0", 0, 50, 10, 0)], {"available_tokens": 0, "evictable_tokens": 100}),
    "evict_queue_order": ([R("r0", 0, 100, 1, 0), R("r1", 60, 0, 1, 0), R("r2", 60, 0, 1, 0)], {"available_tokens": 50}),
    "evicted_below_threshold": ([R("r0", 0, 40, 1, 0), R("r1", 8, 0, 2, 0), R("r2", 100, 0, 1, 0)], {"available_tokens": 35}),
    "release": ([R("r0", 0, 100, 1, 0), R("r1", 0, 100, 1, 0), R("r2", 30, 0, 1, 0)],
                {"available_tokens": 150, "prefill_max_requests": 1, "release_each_tick": True}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(HAND_CASES))
def test_hand_case_on_the_real_prefill_adder(name):
    requests, budgets = HAND_CASES[name]
    assert_same(requests, AdmitBudgets(cp=CpBudgets(enabled=False), **budgets), name)
