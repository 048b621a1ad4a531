"""Two serving runs that must decide the same (the engine's behaviour rule): the same
requests admitted, chunked, preempted, finished, rejected, timed out or cancelled, in the
same iterations, compared exactly; their times within a relative ``REL`` (closed-form
stretches sum durations in another order than iteration by iteration), or exactly when
``exact`` (both sides computed by the same arithmetic)."""

from __future__ import annotations

from typing import Any

import pytest

REL = 1e-9
DECISIONS = (
    "index", "rid", "state", "reject_reason", "prompt_tokens", "max_new_tokens", "generated",
    "prefilled", "preemptions", "recomputed", "l1_hit", "l2_hit",
)  # fmt: skip
"""What a request's fate is made of: compared exactly."""
TIMES = ("arrival_us", "admitted_us", "first_token_us", "finished_us")
"""A request's times: compared within ``REL`` (None on both sides, or on neither)."""


def same_time(a: float | None, b: float | None, exact: bool = False) -> bool:
    if a is None or b is None or exact:
        return a == b
    return a == pytest.approx(b, rel=REL, abs=1e-12)


def assert_same_requests(a: list[Any], b: list[Any], exact: bool = False) -> None:
    """The requests of two runs (input order): the same decisions, the same times."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert [getattr(x, f) for f in DECISIONS] == [getattr(y, f) for f in DECISIONS], x.rid
        for f in TIMES:
            assert same_time(getattr(x, f), getattr(y, f), exact), (x.rid, f)


def assert_same_timeline(a: tuple[list, ...], b: tuple[list, ...], exact: bool = False) -> None:
    """Kept samples (starts, durations, used, held, running, waiting): the same iterations
    with the same counts, their starts and durations within ``REL``."""
    assert len(a[0]) == len(b[0])
    assert list(a[2:]) == list(b[2:])  # used, held, running, waiting: iteration by iteration
    for xs, ys in zip(a[:2], b[:2], strict=True):
        if exact:
            assert xs == ys
        else:
            assert xs == pytest.approx(ys, rel=REL, abs=1e-9)


def assert_same_result(a: Any, b: Any, exact: bool = False) -> None:
    """Two :class:`~cpkv.serving.engine.engine.EngineResult` of :func:`simulate
    <cpkv.serving.engine.simulate.simulate>`: requests, samples, end, iterations, counters."""
    assert a.iterations == b.iterations
    assert same_time(a.end_us, b.end_us, exact)
    assert_same_requests(a.requests, b.requests, exact)
    assert_same_timeline(a.timeline, b.timeline, exact)
    assert_same_counters(a.counters, b.counters, exact)


def assert_same_counters(a: dict[str, Any], b: dict[str, Any], exact: bool = False) -> None:
    """Counters: integers (and dicts of them) exactly; SGLang's final ratio within ``REL``."""
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], float):
            assert same_time(a[key], b[key], exact), key
        else:
            assert a[key] == b[key], key
