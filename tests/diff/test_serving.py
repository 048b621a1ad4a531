"""`cpkv diff` of two serving runs: one verdict ranked goodput, requests lost, latency, cost;
a table of one metric a row; the requests that changed, by rid.

The runs are small: 40 synthetic requests through a tight KV pool (fcfs against lof, the
waiting-queue orders), and seed 004's two block requests (A and B)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from cpkv.diff.compare import Thresholds, diff_paths
from cpkv.diff.serving.verdict import IMPROVEMENT, REGRESSION
from tests.helpers.paths import CONFIGS

QUEUE_ORDERS = {
    "kind": "admit",
    "name": "queue-orders",
    "seed": 2,
    "admit": {
        "policy": "prefill_adder",
        "mode": "serving",
        "workload": {
            "source": "synthetic",
            "synthetic": {
                "count": 40,
                "l1_cached_tokens": {"low": 0, "high": 0},
                "l2_cached_tokens": {"low": 0, "high": 0},
                "extend_tokens": {"low": 256, "high": 8192},
                "max_new_tokens": {"low": 16, "high": 512},
            },
        },
        "max_prefill_tokens": 16384,
        "chunked_prefill_size": 8192,
        "cp": {"enabled": False},
        "kv": {"block_size": 16, "capacity_blocks": 2048, "victim": "least_progress"},
        "arrivals": {"process": "poisson", "rate_rps": 4},
        "slo": {"ttft_ms": 2000, "tpot_ms": 50},
        "serving": {"on_preempt": "requeue", "queue_timeout_ms": 10000, "policy_metrics": True},
    },
}
SEED_BLOCKS = [
    str(CONFIGS / "admit/seed004_blocks.yaml"),
    "admit.mode=serving",
    "admit.kv.scan=first_fit",
    f"admit.workload.path={CONFIGS / 'admit/seed004_requests.jsonl'}",
]


def fcfs_and_lof(cli, tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "queue_orders.yaml"
    config.write_text(yaml.safe_dump(QUEUE_ORDERS))
    for order in ("fcfs", "lof"):
        res = cli("admit", str(config), f"admit.schedule_policy={order}")
        assert res.exit_code == 0, res.output
    a, b = cli.run_dirs()
    return a, b


def row(cli, run: Path) -> dict:
    (only,) = cli.results(run)["rows"]
    return only


def states(run: Path) -> dict[str, tuple[str, int]]:
    """rid: (status, preemptions), read from the run's requests.jsonl."""
    lines = (run / "requests.jsonl").read_text().splitlines()
    return {r["rid"]: (r["status"], r["preemptions"]) for r in map(json.loads, lines)}


def metric(found, key: str):
    return next(m for m in found.metrics if m.key == key)


def table_line(text: str, key: str) -> str:
    return next(line for line in text.splitlines() if f" {key} " in f" {line} ")


def test_more_goodput_with_more_recompute_is_an_improvement_decided_by_goodput(
    cli, tmp_path: Path
) -> None:
    a, b = fcfs_and_lof(cli, tmp_path)
    ra, rb = row(cli, a), row(cli, b)
    # the case: lof lifts goodput, and recomputes KV (from none) and loses requests doing it
    assert rb["goodput_requests_per_s"] > 1.01 * ra["goodput_requests_per_s"]
    assert ra["recompute_bytes"] == 0 < rb["recompute_bytes"]
    assert ra["timed_out"] == 0 < rb["timed_out"]
    (found,) = diff_paths(str(a), str(b)).serving
    assert found.verdict == IMPROVEMENT and found.decided_by.key == "goodput_requests_per_s"
    against = [m.key for m in found.despite]
    assert "requests_lost" in against and "recompute_bytes" in against
    res = cli("diff", str(a), str(b), output=False)
    assert res.exit_code == 0, res.output
    last = res.output.splitlines()[-1]
    assert last.startswith("verdict: IMPROVEMENT (decided by goodput_requests_per_s ")
    assert "despite requests_lost 0 -> " in last
    # one metric a row, never one long line
    assert "better (decides)" in table_line(res.output, "goodput_requests_per_s")
    for key in ("requests_lost", "ttft_p50_ms", "tpot_p99_ms", "recompute_bytes", "preemptions"):
        assert len(table_line(res.output, key)) < 100
    # JSON says what the table says
    doc = json.loads(cli("diff", str(a), str(b), "-f", "json", output=False).output)
    assert doc["regression"] is False and doc["verdict"] == last.removeprefix("verdict: ")
    (serving,) = doc["serving"]
    assert serving["verdict"] == "improvement"
    assert serving["decided_by"]["key"] == "goodput_requests_per_s"
    lost = next(m for m in serving["metrics"] if m["key"] == "requests_lost")
    assert (lost["a"], lost["b"], lost["change"], lost["verdict"]) == (
        0,
        rb["timed_out"],
        "new",
        "worse",
    )


def test_less_goodput_is_a_regression_whatever_it_saves(cli, tmp_path: Path) -> None:
    fcfs, lof = fcfs_and_lof(cli, tmp_path)
    (found,) = diff_paths(str(lof), str(fcfs)).serving  # lof as the base: fcfs loses goodput
    assert found.verdict == REGRESSION and found.decided_by.key == "goodput_requests_per_s"
    assert metric(found, "recompute_bytes").verdict == "better"  # no recompute at all now
    assert metric(found, "requests_lost").verdict == "better"
    res = cli("diff", str(lof), str(fcfs), output=False)
    assert res.exit_code == 1
    assert res.output.splitlines()[-1].startswith(
        "verdict: REGRESSION (decided by goodput_requests_per_s "
    )


def test_lost_requests_count_against_a_run_above_its_latency(cli, tmp_path: Path) -> None:
    a, b = fcfs_and_lof(cli, tmp_path)
    # goodput out of the ranking: the timed-out requests decide, though TTFT p50 improved
    ignored = Thresholds.parse(["goodput_requests_per_s:1000"])
    (found,) = diff_paths(str(a), str(b), ignored).serving
    assert metric(found, "goodput_requests_per_s").verdict == "same"
    assert metric(found, "ttft_p50_ms").verdict == "better"
    assert found.verdict == REGRESSION and found.decided_by.key == "requests_lost"
    assert metric(found, "timed_out").verdict == "worse"
    res = cli("diff", str(a), str(b), "-t", "goodput_requests_per_s:1000", output=False)
    assert res.exit_code == 1
    assert res.output.splitlines()[-1].startswith(
        "verdict: REGRESSION (decided by requests_lost 0 -> "
    )
    assert "- timed_out" in table_line(res.output, "timed_out")
    assert "worse" in table_line(res.output, "timed_out")
    # the run's counts of lost requests are in the ranked table, never a 'changed' summary line
    assert "policy_space.terminal.timed_out" not in res.output


def test_a_change_from_zero_reads_new_never_inf(cli, tmp_path: Path) -> None:
    a, b = fcfs_and_lof(cli, tmp_path)
    res = cli("diff", str(a), str(b), "--all", output=False)
    line = table_line(res.output, "recompute_bytes")
    assert re.search(r"recompute_bytes +0 +[\d.]+ [kMGT]?B +new +worse", line), line
    assert not re.search(r"\binf\b", res.output)
    # an admission diff's counts from zero too (stops_by_budget.cp_max_batch_requests: 0 -> n)
    assert cli("admit").exit_code == 0
    assert cli("admit", "admit.cp.max_batch_requests=4").exit_code == 0
    grid_a, grid_b = cli.run_dirs()[-2:]
    text = cli("diff", str(grid_a), str(grid_b), output=False).output
    stops = table_line(text, "stops_by_budget.cp_max_batch_requests")
    assert " new " in stops and not re.search(r"\binf\b", text)


def test_requests_that_changed_are_listed_with_their_rids(cli) -> None:
    """Seed 004: conservative makes B wait for A; optimistic admits both at once and
    preempts A; a 10 ms queue timeout drops B, which waits longer than that."""
    for extra in ((), ("admit.policy=optimistic",), ("admit.serving.queue_timeout_ms=10",)):
        assert cli("admit", *SEED_BLOCKS, *extra).exit_code == 0
    conservative, optimistic, timeout = cli.run_dirs()
    assert states(timeout) == {"A": ("finished", 0), "B": ("timed_out", 0)}

    requests = diff_paths(str(conservative), str(optimistic)).serving[0].requests
    assert requests.matched == 2 and not requests.only_a and not requests.only_b
    assert requests.groups == {
        "preempted in B, not in A": ["A"],
        "admitted earlier in B": ["B"],
    }
    back = diff_paths(str(optimistic), str(conservative)).serving[0].requests
    assert back.groups == {"preempted in A, not in B": ["A"], "admitted later in B": ["B"]}

    lost = diff_paths(str(conservative), str(timeout)).serving[0]
    assert lost.requests.groups == {"timed_out in B, finished in A": ["B"]}
    assert [(c.rid, c.verdict) for c in lost.requests.rows] == [("B", "worse")]
    found = diff_paths(str(timeout), str(conservative)).serving[0].requests
    assert found.groups == {"finished in B, timed_out in A": ["B"]}

    text = cli("diff", str(conservative), str(timeout), output=False).output
    assert "- timed_out in B, finished in A: 1 (B)" in text
    (line,) = [line for line in text.splitlines() if line.startswith("B  ")]
    assert line.split()[:4] == ["B", "finished", "->", "timed_out"]


def test_the_rids_listed_are_those_whose_status_changed(cli, tmp_path: Path) -> None:
    a, b = fcfs_and_lof(cli, tmp_path)
    sa, sb = states(a), states(b)
    timed_out = [r for r in sa if sa[r][0] == "finished" and sb[r][0] == "timed_out"]
    finished = [r for r in sa if sa[r][0] != "finished" and sb[r][0] == "finished"]
    preempted = [r for r in sa if sa[r][1] == 0 < sb[r][1]]
    assert timed_out and preempted  # lof times out requests that fcfs finishes, and preempts
    requests = diff_paths(str(a), str(b)).serving[0].requests
    assert requests.matched == len(sa) == len(sb)
    assert requests.groups["timed_out in B, finished in A"] == timed_out
    assert sorted(requests.groups["preempted in B, not in A"]) == sorted(preempted)
    assert [rid for g, rids in requests.groups.items() if g.startswith("finished in B")
            for rid in rids] == finished  # fmt: skip
    doc = json.loads(cli("diff", str(a), str(b), "-f", "json", output=False).output)
    assert doc["serving"][0]["requests"]["groups"]["timed_out in B, finished in A"] == timed_out
    text = cli("diff", str(a), str(b), output=False).output
    listed = f"- timed_out in B, finished in A: {len(timed_out)} ({', '.join(timed_out[:8])}"
    assert listed in text


def test_the_inter_token_latency_ranks_with_latency_and_is_shown_once(cli, tmp_path: Path):
    """ITL p50 and p99 are latency metrics of the ranked table; the summary's ``itl_ms``
    mirrors the row's ``itl_*_ms`` and is not listed again as a summary change."""
    a, b = fcfs_and_lof(cli, tmp_path)
    ra, rb = row(cli, a), row(cli, b)
    assert ra["itl_p99_ms"] != rb["itl_p99_ms"]
    assert cli.results(a)["summary"]["itl_ms"]["p99"] == ra["itl_p99_ms"]
    diff = diff_paths(str(a), str(b))
    (found,) = diff.serving
    assert {metric(found, k).tier for k in ("itl_p50_ms", "itl_p99_ms")} == {"latency"}
    assert metric(found, "itl_p99_ms").a == ra["itl_p99_ms"]
    assert not [c.key for c in diff.summary if c.key.startswith("itl_ms")]
    res = cli("diff", str(a), str(b), output=False)
    assert "itl_ms" not in res.output and len(table_line(res.output, "itl_p99_ms")) < 100


def test_a_summary_value_mirrors_its_row_metric():
    from cpkv.diff.summary import row_metric_of

    assert row_metric_of("itl_ms.p99") == "itl_p99_ms"
    assert row_metric_of("itl_ms.mean") == "itl_mean_ms"
    for key in ("time.busy_s", "decode_tokens", "cluster.per_instance", "a_ms.b.c"):
        assert row_metric_of(key) == key  # (no series_unit.stat shape: itself)
