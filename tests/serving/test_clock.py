"""The simulation clock's range: a run whose times the float64 µs clock cannot resolve to
1 µs is refused (before it runs when its arrivals say so, after it when its end does), and a
run that loses a request is an error, never a result."""

from __future__ import annotations

import json
import math

import pytest

from cpkv.core.errors import ConfigError
from cpkv.core.schema.limits import CLOCK_LIMIT_S, CLOCK_LIMIT_US
from cpkv.serving.engine.clock import (
    POISSON_MISS,
    check_arrivals,
    check_conserved,
    check_end,
    last_arrival_us,
    poisson_span_factor,
)
from cpkv.serving.input.arrivals import trace_period
from cpkv.serving.input.workload import ServingRequest, ServingWorkload
from cpkv.serving.schema import ArrivalsSpec


def test_the_limit_is_where_floats_stop_resolving_one_microsecond() -> None:
    below, at = CLOCK_LIMIT_US / 2, CLOCK_LIMIT_US
    assert math.nextafter(below, math.inf) - below <= 1.0
    assert math.nextafter(at, math.inf) - at > 1.0
    assert (at + 0.5) - at == 0.0  # half a microsecond is lost at the limit


def _workload(*arrivals_ms: float, repeat: int = 1) -> ServingWorkload:
    return ServingWorkload(
        tuple(ServingRequest(f"r{i}", ms, 10, 2) for i, ms in enumerate(arrivals_ms)),
        repeat=repeat,
    )


def test_poisson_arrivals_are_judged_by_a_span_they_exceed_with_probability_1e_9() -> None:
    w = _workload(0, 0, 0, 0)
    t = poisson_span_factor(4)
    assert math.exp(-4 * (t - 1 - math.log(t))) == pytest.approx(POISSON_MISS)
    fits = 4 * t / CLOCK_LIMIT_S  # 4 requests at this rate take the clock's whole range
    check_arrivals(w, ArrivalsSpec("poisson", rate_rps=fits * 1.01))
    with pytest.raises(ConfigError) as err:
        check_arrivals(w, ArrivalsSpec("poisson", rate_rps=fits * 0.99))
    assert str(err.value).startswith("admit.arrivals.rate_rps: 4 requests")
    assert f"a rate above {fits:.4g} requests/s" in str(err.value)


def test_trace_arrivals_are_their_last_time_over_the_speedup_repeats_included() -> None:
    w = _workload(0, 5_000.0, 1_000.0)
    assert last_arrival_us(w, ArrivalsSpec("trace", speedup=2.0)) == 5_000.0 / 2 * 1e3
    repeated = _workload(0, 5_000.0, 1_000.0, repeat=3)
    period = trace_period(repeated.requests)
    assert last_arrival_us(repeated, ArrivalsSpec("trace")) == (5_000.0 + 2 * period) * 1e3
    assert last_arrival_us(w, ArrivalsSpec("zero")) == 0.0
    slowest = 5_000.0 * 1e3 / CLOCK_LIMIT_US  # the speedup that puts the last arrival at the limit
    check_arrivals(w, ArrivalsSpec("trace", speedup=slowest * 1.01))
    with pytest.raises(ConfigError, match="admit.arrivals.speedup: the last of 3 requests"):
        check_arrivals(w, ArrivalsSpec("trace", speedup=slowest * 0.99))


def test_a_run_that_ends_past_the_clock_is_refused() -> None:
    check_end(CLOCK_LIMIT_US - 1.0, 8)
    for end in (CLOCK_LIMIT_US, math.inf, math.nan):
        with pytest.raises(ConfigError, match="admit.mode=serving: the run of 8 requests"):
            check_end(end, 8)


def test_a_lost_request_is_an_internal_error() -> None:
    check_conserved(8, 8)
    with pytest.raises(RuntimeError, match="given 8 requests and accounted for 7"):
        check_conserved(8, 7)


def test_a_run_whose_iterations_outlast_the_clock_fails_in_one_line(cli) -> None:
    # 1e15 µs per iteration: a few iterations pass 2**53 µs
    res = cli("admit", "admit.mode=serving", "admit.kv.capacity_blocks=4096",
              "admit.cost.kind=linear", "admit.cost.fixed_us=1e15")  # fmt: skip
    assert res.exit_code == 2
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("cpkv: error: admit.mode=serving: the run of 8 requests reached")
    (run,) = cli.run_dirs()
    assert not (run / "results.json").exists()
    assert json.loads((run / "meta.json").read_text())["status"] == "failed"


def test_a_run_that_loses_a_request_writes_no_result(cli, monkeypatch) -> None:
    from cpkv.serving.record.requests import RequestStats

    done = RequestStats.done

    def lose_the_last(self, r, *index):  # the last of the 8 in input order never reaches them
        if r.index != 7:
            done(self, r, *index)

    monkeypatch.setattr(RequestStats, "done", lose_the_last)
    with pytest.raises(RuntimeError, match="given 8 requests and accounted for 7"):
        cli("admit", "admit.mode=serving", "admit.kv.capacity_blocks=4096")
    (run,) = cli.run_dirs()
    assert not (run / "results.json").exists()
