"""SGLang's adaptive new_token_ratio: hand-derived values, properties, and (optionally) real sglang."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.admission.token_ratio import NewTokenRatio
from cpkv.core.errors import ConfigError
from tests.helpers.paths import REPO


def _oracle_python() -> Path:
    """A python with sglang: $CPKV_ORACLE_PYTHON, this one, or the oracle venv of .ci/run."""
    if os.environ.get("CPKV_ORACLE_PYTHON"):
        return Path(os.environ["CPKV_ORACLE_PYTHON"])
    if importlib.util.find_spec("sglang") is not None:
        return Path(sys.executable)
    return REPO / ".oracle-venv" / "bin" / "python"


ORACLE_PYTHON = _oracle_python()


def test_defaults_are_sglangs() -> None:
    r = NewTokenRatio()
    assert r == NewTokenRatio.from_settings()
    assert r.current == r.init_ratio == 0.7
    assert r.min_ratio == pytest.approx(0.098)  # 0.7 * 0.14
    assert r.decay_per_step == pytest.approx(0.602 / 600)
    assert r.retract_decode_steps == 20


def test_conservativeness_scales_init_and_clamps_at_one() -> None:
    assert NewTokenRatio.from_settings(conservativeness=0.5).init_ratio == pytest.approx(0.35)
    high = NewTokenRatio.from_settings(conservativeness=2.0)
    assert (high.init_ratio, high.min_ratio) == (1.0, pytest.approx(0.14))


def test_decay_reaches_min_after_600_steps_and_stays() -> None:
    r = NewTokenRatio()
    for _ in range(300):
        r = r.decayed()
    assert r.current == pytest.approx((0.7 + 0.098) / 2)  # halfway
    for _ in range(400):
        r = r.decayed()
    assert r.current == r.min_ratio
    assert r.reset().current == 0.7


def test_retract_estimate_counts_the_requests_that_stay() -> None:
    r = NewTokenRatio()
    # kept: 10 of 100 generated, 0 of 50: (10 + 0 + 20 * 2) / (150 + 1)
    assert r.retracted([(10, 100), (0, 50)]).current == pytest.approx(50 / 151)
    assert r.retracted([(90, 100)]).current == 1.0  # (90 + 20) / 101 clamps at 1
    assert r.retracted([]).current == 0.0  # nothing kept: 0 / 1


def test_retract_may_go_below_min_and_the_next_decay_lifts_it() -> None:
    r = NewTokenRatio().retracted([(0, 10_000)])  # 20 / 10001 < 0.098
    assert r.current == pytest.approx(20 / 10_001)
    assert r.decayed().current == r.min_ratio


def test_bad_settings_raise() -> None:
    with pytest.raises(ConfigError, match="decay_steps"):
        NewTokenRatio.from_settings(decay_steps=0)
    with pytest.raises(ConfigError, match="conservativeness"):
        NewTokenRatio.from_settings(conservativeness=-1)


ops = st.lists(
    st.one_of(
        st.just("decay"),
        st.just("reset"),
        st.lists(st.tuples(st.integers(0, 500), st.integers(0, 4000)), max_size=5),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, conservativeness=st.sampled_from([0.3, 1.0, 1.3, 2.0]))
def test_matches_exact_rational_reference(ops, conservativeness) -> None:
    init = min(Fraction(7, 10) * Fraction(conservativeness), Fraction(1))
    floor = init * Fraction(14, 100)
    cur = init
    r = NewTokenRatio.from_settings(conservativeness=conservativeness)
    for op in ops:
        if op == "decay":
            cur, r = max(cur - (init - floor) / 600, floor), r.decayed()
        elif op == "reset":
            cur, r = init, r.reset()
        else:
            cur = min(
                Fraction(1),
                Fraction(sum(g for g, _ in op) + 20 * len(op), sum(m for _, m in op) + 1),
            )
            r = r.retracted(op)
        assert float(cur) == pytest.approx(r.current, abs=1e-12)
        assert r.current <= 1.0


ORACLE_SCRIPT = """
import json, sys
from types import SimpleNamespace as NS
import sglang.srt.managers.scheduler_components.new_token_ratio_tracker as m
from tests.helpers.paths import REPO
results = []
for job in json.load(sys.stdin):
    m.get_schedule = lambda: NS(schedule_conservativeness=job["conservativeness"])
    t = m.NewTokenRatioTracker.from_config()
    out = []
    for op in job["ops"]:
        if op == "decay":
            t.decay_step()
        elif op == "reset":
            t.reset()
        else:
            reqs = [NS(output_ids=[0] * g, sampling_params=NS(max_new_tokens=n)) for g, n in op]
            t.current = m.NewTokenRatioTracker.estimate_new_token_ratio_after_retract(reqs)
        out.append(t.current)
    results.append(out)
print(json.dumps(results))
"""


@pytest.mark.slow
@pytest.mark.sglang  # .ci/run's `-m sglang` pass runs it in the oracle venv
@pytest.mark.skipif(not ORACLE_PYTHON.exists(), reason="no sglang venv (set CPKV_ORACLE_PYTHON)")
def test_bit_identical_to_real_sglang_tracker() -> None:
    rng = random.Random(6)
    ops: list = []
    for _ in range(1500):
        roll = rng.random()
        if roll < 0.9:
            ops.append("decay")
        elif roll < 0.95:
            ops.append("reset")
        else:
            ops.append(
                [[rng.randint(0, 300), rng.randint(1, 4000)] for _ in range(rng.randint(0, 4))]
            )
    jobs = [{"conservativeness": c, "ops": ops} for c in (1.0, 0.8, 1.7)]
    env = {**os.environ, "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": "250"}
    done = subprocess.run(
        [str(ORACLE_PYTHON), "-c", ORACLE_SCRIPT],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    wants = json.loads(done.stdout.strip().splitlines()[-1])
    for job, want in zip(jobs, wants, strict=True):
        r = NewTokenRatio.from_settings(conservativeness=job["conservativeness"], decay_steps=250)
        got = []
        for op in ops:
            r = r.decayed() if op == "decay" else r.reset() if op == "reset" else r.retracted(op)
            got.append(r.current)
        assert got == want, f"conservativeness {job['conservativeness']}"


def _decayed_one_by_one(ratio: NewTokenRatio, steps: int) -> list[float]:
    """The definition: a decay step at a time while above min (then it stays)."""
    out, current = [], ratio.current
    for _ in range(steps):
        if current > ratio.min_ratio:
            current = max(current - ratio.decay_per_step, ratio.min_ratio)
        out.append(current)
    return out


@settings(max_examples=200, deadline=None)
@given(
    start=st.floats(0.0, 1.0),
    decay_steps=st.integers(1, 50),
    walk=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 80)), max_size=6),
)
def test_the_decay_path_is_the_decay_step_by_step(start, decay_steps, walk) -> None:
    """``decay_path`` and ``after_decode_steps`` (which share a path between trackers that
    decayed from one value) give the values of the steps taken one at a time, whatever the
    walk: looks ahead of several lengths, then a stretch of steps, again and again."""
    ratio = NewTokenRatio.from_settings(decay_steps=decay_steps)
    ratio = NewTokenRatio(ratio.init_ratio, ratio.min_ratio, ratio.decay_per_step, start)
    for ahead, taken in walk:
        assert list(ratio.decay_path(ahead)) == _decayed_one_by_one(ratio, ahead)
        want = _decayed_one_by_one(ratio, taken)
        ratio = ratio.after_decode_steps(taken)
        assert ratio.current == (want[-1] if want else ratio.current)
