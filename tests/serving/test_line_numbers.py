"""``requests.jsonl``'s numbers written with numpy (:mod:`cpkv.serving.record.lines`) against
what :mod:`json` writes for the same values: times as ``round(x, 6)`` (NaN: null), integers
as they are (-1: null)."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from cpkv.serving.record.lines import integer_column, time_column


def written(column: np.ndarray) -> list[str]:
    """A column's rows as text (the NUL padding dropped)."""
    return [row.tobytes().replace(b"\0", b"").decode() for row in column]


def as_json(v: float) -> str:
    return json.dumps(None if v != v else round(v, 6))


halves = st.integers(0, 10**12).map(lambda k: k / 2_000_000)  # exact ties of the 6th decimal
times = st.one_of(
    st.floats(0.0, 2e9, allow_nan=False), st.floats(-5.0, 5.0), st.just(float("nan")),
    halves, st.floats(0.0, 1e-3), st.sampled_from([0.0, -0.0, 1e-4, 999_999_999.0, 2.5e-7]),
)  # fmt: skip


@hyp_settings(max_examples=300, deadline=None)
@given(st.lists(times, min_size=1, max_size=40))
def test_times_are_written_as_json_writes_them_rounded(values):
    x = np.array(values, dtype=float)
    assert written(time_column(x)) == [as_json(v) for v in values]


@hyp_settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 2**62), st.just(-1), st.integers(0, 999)), min_size=1))
def test_integers_are_written_as_json_writes_them(values):
    v = np.array(values, dtype=np.int64)
    assert written(integer_column(v)) == [json.dumps(None if k < 0 else k) for k in values]
