"""``cpkv admit`` with ``admit.cluster`` in cpkv's loop: one instance through the driver gives
the plain run's rows and files byte for byte; several instances report per instance and in
total."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.close_json import assert_close, assert_close_lines
from tests.helpers.paths import MOONCAKE_TRACE, REPO

CONFIG = str(REPO / "configs/admit/serving_mooncake.yaml")
SLICE = [
    CONFIG, f"admit.workload.path={MOONCAKE_TRACE}", "admit.workload.limit=300",
    "admit.arrivals.speedup=2", "admit.engine=cpkv",
]  # fmt: skip

needs_trace = pytest.mark.skipif(not MOONCAKE_TRACE.is_file(), reason="no Mooncake trace")


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _run(cli, *extra: str) -> Path:
    before = set(cli.run_dirs())
    res = cli("admit", *SLICE, *extra)
    assert res.exit_code == 0, res.output
    (run,) = set(cli.run_dirs()) - before
    return run


@needs_trace
@pytest.mark.parametrize(
    ("router", "policy"),
    [
        ("round_robin", ()),
        ("prefix_aware", ()),
        # the policy space's machinery: timeouts end requests in the queue, the policy columns
        (
            "round_robin",
            (
                "admit.serving.queue_timeout_ms=3000",
                "admit.serving.cuda_graph_buckets=[1,2,4,8,16]",
            ),
        ),
    ],
)
def test_one_instance_through_the_driver_is_the_plain_run(cli, router, policy) -> None:
    # instances: 1 with trace events runs through the cluster driver (deliver/advance, every
    # iteration a full one); without, the plain engine with its closed-form stretches: the
    # same decisions, times equal but for rounding
    plain = _run(cli, *policy)
    driven = _run(
        cli, *policy, "admit.cluster.instances=1", f"admit.cluster.router={router}",
        "admit.serving.trace_events=true",
    )  # fmt: skip
    if policy:
        (row,) = cli.results(plain)["rows"]
        assert row["timed_out"] > 0 and row["padding_ms"] > 0  # the machinery did something
    for name in ("requests.jsonl", "timeline.jsonl"):
        assert_close_lines(driven / name, plain / name)
    a, b = cli.results(plain), cli.results(driven)
    assert_close(a["rows"], b["rows"], "rows")
    assert_close(
        {k: v for k, v in a["summary"].items() if k not in ("notes", "timing")},
        {k: v for k, v in b["summary"].items() if k not in ("notes", "timing")},
        "summary",
    )
    assert (driven / "trace.json").is_file() and not (plain / "trace.json").exists()


@needs_trace
def test_four_instances_report_per_instance_and_in_total(cli) -> None:
    run = _run(cli, "admit.cluster.instances=4", "admit.cluster.router=prefix_aware")
    doc = cli.results(run)
    (row,) = doc["rows"]
    cluster = doc["summary"]["cluster"]
    per = cluster["per_instance"]
    assert cluster["instances"] == 4 and [x["instance"] for x in per] == [0, 1, 2, 3]
    assert sum(x["routed"] for x in per) == row["requests"] == 300
    assert sum(cluster["routed_by_rule"].values()) == 300
    assert sum(x["finished"] for x in per) == row["finished"]
    # the load imbalance is max / mean of the busy times
    busy = [x["busy_s"] for x in per]
    assert cluster["load_imbalance"] == pytest.approx(max(busy) / (sum(busy) / 4), rel=1e-3)
    reqs = _lines(run / "requests.jsonl")
    assert [r["rid"] for r in reqs] == [f"r{k}" for k in range(300)]
    routed = [sum(r["instance"] == k for r in reqs) for k in range(4)]
    assert routed == [x["routed"] for x in per]
    # hit ratios per tier: the instance's requests' hit tokens over their prompt tokens
    for k, x in enumerate(per):
        mine = [r for r in reqs if r["instance"] == k and r["l1_hit_tokens"] is not None]
        prompt = sum(r["prompt_tokens"] for r in mine)
        assert x["l1_hit_pct"] == pytest.approx(
            100 * sum(r["l1_hit_tokens"] for r in mine) / prompt, abs=1e-3
        )
        assert x["l2_hit_pct"] == pytest.approx(
            100 * sum(r["l2_hit_tokens"] for r in mine) / prompt, abs=1e-3
        )
    instances = _lines(run / "instances.jsonl")
    assert [x["routed"] for x in instances] == routed
    timeline = _lines(run / "timeline.jsonl")
    assert sorted({p["instance"] for p in timeline}) == [0, 1, 2, 3] and len(timeline) == 800
    assert "4 instances behind prefix_aware" in (run / "results.txt").read_text()


@needs_trace
def test_a_shared_l2_serves_prefixes_another_instance_computed(cli) -> None:
    # round robin scatters the trace's shared prefixes: with one shared L2, an instance finds
    # in L2 what another computed, so more of the prompts hit L2 than with an L2 each
    own = cli.results(_run(cli, "admit.cluster.instances=4"))["summary"]["cluster"]
    shared = cli.results(_run(cli, "admit.cluster.instances=4", "admit.cluster.shared_l2=true"))
    shared = shared["summary"]["cluster"]
    assert shared["shared_l2"] and not own["shared_l2"]
    assert shared["l2_hit_pct"] > own["l2_hit_pct"]


@needs_trace
def test_same_config_and_seed_route_the_same_way(cli) -> None:
    args = ("admit.cluster.instances=3", "admit.cluster.router=power_of_two", "seed=7")
    a, b = _run(cli, *args), _run(cli, *args)
    assert (a / "requests.jsonl").read_bytes() == (b / "requests.jsonl").read_bytes()
    assert (a / "instances.jsonl").read_bytes() == (b / "instances.jsonl").read_bytes()
    c = _run(cli, "admit.cluster.instances=3", "admit.cluster.router=power_of_two", "seed=8")
    routed = [[r["instance"] for r in _lines(run / "requests.jsonl")] for run in (a, c)]
    assert routed[0] != routed[1]  # the seed draws the two instances


@needs_trace
def test_the_policy_columns_add_up_over_the_instances(cli) -> None:
    run = _run(
        cli, "admit.cluster.instances=3", "admit.serving.queue_timeout_ms=3000",
        "admit.arrivals.speedup=6",
    )  # fmt: skip
    doc = cli.results(run)
    (row,) = doc["rows"]
    reqs = _lines(run / "requests.jsonl")
    statuses = [r["status"] for r in reqs]
    assert row["timed_out"] == statuses.count("timed_out") > 0
    assert row["finished"] == statuses.count("finished")
    assert doc["summary"]["policy_space"]["terminal"]["timed_out"] == row["timed_out"]
    per = doc["summary"]["cluster"]["per_instance"]
    assert sum(x["finished"] for x in per) == row["finished"]
