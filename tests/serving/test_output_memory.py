"""The memory check before a serving run covers its outputs: the timeline's buckets (refused
up front, one line, when they cannot fit) and the trace events (streamed: a constant)."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from cpkv.admit.schema import AdmitBlock, AdmitConfig, memory_need
from cpkv.core.errors import UnsupportedError
from cpkv.core.memory import check_fits
from cpkv.serving.cluster.schema import ClusterSpec
from cpkv.serving.cost.report import FIELDS
from cpkv.serving.record.memory import (
    BYTES_PER_TIMELINE_POINT,
    TRACE_PENDING_BYTES,
    output_need,
)
from cpkv.serving.record.timeline import TimelineSums
from cpkv.serving.schema import ServingSpec
from tests.helpers.paths import REPO

SERVING = str(REPO / "configs/serving.yaml")


def _block(points: int = 200, instances: int = 1, trace: bool = False, mode: str = "serving"):
    return AdmitBlock(
        mode=mode, serving=ServingSpec(timeline_points=points, trace_events=trace),
        cluster=ClusterSpec(instances=instances),
    )  # fmt: skip


def test_the_timeline_counts_per_bucket_and_instance() -> None:
    one, what = output_need(_block(10_000))
    assert one == 10_000 * BYTES_PER_TIMELINE_POINT and "admit.serving.timeline_points" in what[0]
    four, what = output_need(_block(10_000, instances=4))
    assert four == 4 * one and "4 instances" in what[0]
    traced, _ = output_need(_block(10_000, trace=True))
    assert traced == one + TRACE_PENDING_BYTES  # streamed: the same for any run length
    assert output_need(_block(10**9, mode="passes")) == (0.0, [])


def test_the_need_adds_the_requests_and_the_outputs() -> None:
    plain = memory_need(AdmitConfig(admit=_block(mode="passes")))
    both = memory_need(AdmitConfig(admit=_block(10**6)))
    assert both.bytes == plain.bytes + 10**6 * BYTES_PER_TIMELINE_POINT
    assert plain.what in both.what and "timeline_points" in both.what


def test_a_bucket_holds_at_least_the_bytes_counted() -> None:
    # the sums, the rows and the lines of timeline.jsonl, as a run holds them at its end
    points = 20_000
    tracemalloc.start()
    try:
        sums = TimelineSums(1e6, points)
        t0, dt = np.array([0.0, 5e5]), np.array([10.0, 10.0])
        sums.add(t0, dt, (np.array([1, 2]),) * 4, [0.0] * FIELDS)
        rows = sums.rows(100, None)
        text = "".join(json.dumps(p, separators=(",", ":")) + "\n" for p in rows)
        held = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(rows) == points and text
    assert held >= points * BYTES_PER_TIMELINE_POINT


def test_a_billion_buckets_are_refused_by_the_bound(cli) -> None:
    res = cli("admit", SERVING, "admit.serving.timeline_points=1000000000")
    assert res.exit_code == 2, res.output
    (line,) = [x for x in res.output.splitlines() if x.strip()]
    assert "admit.serving.timeline_points: must be <= 100000" in line and "8K screen" in line
    assert "Traceback" not in res.output and cli.run_dirs() == []


def test_buckets_of_many_instances_beyond_memory_are_refused_up_front(cli) -> None:
    res = cli(
        "admit", SERVING, "admit.cluster.instances=4096", "admit.serving.timeline_points=100000"
    )
    assert res.exit_code == 2, res.output
    (line,) = [x for x in res.output.splitlines() if x.strip()]
    assert "admit.serving.timeline_points: 100,000 buckets x 4096 instances" in line
    assert "GiB" in line and "Traceback" not in res.output and cli.run_dirs() == []


def test_a_sweep_point_with_too_many_buckets_is_refused_before_any_point(cli) -> None:
    res = cli("sweep", SERVING, "admit.serving.timeline_points=200,1000000000")
    assert res.exit_code == 2, res.output
    assert "timeline_points" in res.output and cli.run_dirs() == []


def test_the_check_refuses_what_this_machine_cannot_hold() -> None:
    need = memory_need(AdmitConfig(admit=_block(10**9)))
    with pytest.raises(UnsupportedError) as err:
        check_fits(need, available=10 * 2**30)
    assert "\n" not in str(err.value) and "needs at least" in str(err.value)
    check_fits(memory_need(AdmitConfig(admit=_block())), available=10 * 2**30)  # the default fits
