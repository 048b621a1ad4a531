"""``admit.arrivals`` of the serving simulation (``trace`` timestamps, ``speedup``, ``zero``):
the arrival times themselves and their effect on queue time, TTFT and the makespan, against
values derived here by hand (the Poisson process is covered by test_serving_cli.py).

The hand runs: each request has a 4-token prompt and 1 output token, the pool and the
token budget are large, an iteration costs a fixed 1 ms, so a request is admitted at the
first iteration that starts at or after its arrival (when nothing runs, time jumps to the
next arrival), prefilled and given its one token in that iteration, and finishes at its
end; iterations run back to back while requests wait.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpkv.serving.input.workload import ServingRequest, with_arrivals
from cpkv.serving.schema import ArrivalsSpec
from tests.helpers.paths import MOONCAKE_TRACE, REPO

approx = pytest.approx
ROOT = REPO
TRACE = MOONCAKE_TRACE

TIMESTAMPS = [0.0, 0.5, 5.0]  # ms, one request each, in file order

COMMON = """\
  policy: conservative
  kv: {block_size: 4, capacity_blocks: 64, scan: first_fit, victim: scan_order}
  iteration: {budget_tokens: 1000, chunk_tokens: 1000}
  cost: {kind: linear, fixed_us: 1000, prefill_token_us: 0, decode_request_us: 0, context_token_us: 0,
         kv_bytes_per_token: 1, l2_load_gb_per_s: null}
"""


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _trace_workload(tmp_path: Path, stamps: list[float]) -> str:
    """A Mooncake trace of the requests (distinct hash ids: no prefix hits)."""
    path = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": t, "input_length": 4, "output_length": 1, "hash_ids": [k]}
        for k, t in enumerate(stamps)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return (
        f"  workload: {{source: trace, path: {path}, format: mooncake, block_size: 4,\n"
        "             cache: {l1_tokens: 1024, l2_tokens: 0}}\n"
    )


def _jsonl_workload(tmp_path: Path, stamps: list[float]) -> str:
    """The same requests as prefill-model JSONL lines with ``arrival_ms``."""
    path = tmp_path / "requests.jsonl"
    rows = [
        {"rid": f"r{k}", "extend_tokens": 4, "max_new_tokens": 1, "arrival_ms": t}
        for k, t in enumerate(stamps)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"  workload: {{source: jsonl, path: {path}}}\n"


WORKLOADS = {"trace": _trace_workload, "jsonl": _jsonl_workload}


def _serve(
    cli, tmp_path: Path, workload: str, arrivals: str, stamps: list[float] = TIMESTAMPS
) -> tuple[dict, dict, list[dict]]:
    cfg = tmp_path / "serving.yaml"
    cfg.write_text(
        "kind: admit\nname: arrivals\nseed: 0\nadmit:\n  mode: serving\n"
        + WORKLOADS[workload](tmp_path, stamps)
        + f"  arrivals: {arrivals}\n"
        + COMMON
    )
    res = cli("admit", str(cfg))
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    doc = cli.results(run)
    return doc["rows"][0], doc["summary"], _lines(run / "requests.jsonl")


# speedup -> arrivals (timestamps / speedup), admissions, finishes, queue, TTFT (ms), makespan
#  1:   0, 0.5, 5    r1 waits for it 0 [0, 1], runs [1, 2]; idle until 5, r2 [5, 6]
#  2:   0, 0.25, 2.5 r1 runs [1, 2]; idle until 2.5, r2 [2.5, 3.5]
#  0.5: 0, 1, 10     r1 arrives as it 0 ends: no wait, [1, 2]; r2 [10, 11]
CASES = {
    1.0: ([0, 0.5, 5], [0, 1, 5], [1, 2, 6], [0, 0.5, 0], [1, 1.5, 1], 6.0),
    2.0: ([0, 0.25, 2.5], [0, 1, 2.5], [1, 2, 3.5], [0, 0.75, 0], [1, 1.75, 1], 3.5),
    0.5: ([0, 1, 10], [0, 1, 10], [1, 2, 11], [0, 0, 0], [1, 1, 1], 11.0),
}


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("speedup", sorted(CASES))
def test_trace_arrivals_divided_by_speedup(cli, tmp_path, workload, speedup) -> None:
    arrive, admit, finish, queue, ttft, span = CASES[speedup]
    row, summary, reqs = _serve(cli, tmp_path, workload, f"{{process: trace, speedup: {speedup}}}")
    assert [r["rid"] for r in reqs] == ["r0", "r1", "r2"]
    assert [r["arrival_ms"] for r in reqs] == approx(arrive)
    assert [r["admitted_ms"] for r in reqs] == approx(admit)
    assert [r["finish_ms"] for r in reqs] == approx(finish)
    assert [r["queue_ms"] for r in reqs] == approx(queue)
    assert [r["ttft_ms"] for r in reqs] == approx(ttft)
    assert row["makespan_s"] == approx(span / 1000)
    assert row["iterations"] == 3 and row["finished"] == 3
    assert row["queue_mean_ms"] == approx(sum(queue) / 3)
    assert row["ttft_mean_ms"] == approx(sum(ttft) / 3)
    assert row["e2e_mean_ms"] == approx(sum(ttft) / 3)  # one token: E2E = TTFT
    assert summary["arrivals"]["process"] == "trace"
    assert summary["arrivals"]["speedup"] == speedup


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_zero_arrivals_start_everything_at_once(cli, tmp_path, workload) -> None:
    # every request at 0: all three admitted and finished in iteration 0 [0, 1]
    row, summary, reqs = _serve(cli, tmp_path, workload, "{process: zero}")
    assert [r["arrival_ms"] for r in reqs] == [0.0, 0.0, 0.0]
    assert [r["admitted_ms"] for r in reqs] == [0.0, 0.0, 0.0]
    assert [r["finish_ms"] for r in reqs] == approx([1.0, 1.0, 1.0])
    assert row["iterations"] == 1 and row["makespan_s"] == approx(0.001)
    assert (row["queue_p99_ms"], row["ttft_p99_ms"]) == approx((0.0, 1.0))
    assert summary["arrivals"]["process"] == "zero"


def test_later_timestamp_in_file_order_is_still_served_by_time(cli, tmp_path) -> None:
    # r0 at 3 ms, r1 at 0: r1 runs [0, 1]; idle until 3, r0 runs [3, 4]
    row, _, reqs = _serve(cli, tmp_path, "trace", "{process: trace}", [3.0, 0.0, 3.0])
    assert [r["arrival_ms"] for r in reqs] == [3.0, 0.0, 3.0]
    assert [r["finish_ms"] for r in reqs] == approx([4.0, 1.0, 4.0])
    assert row["makespan_s"] == approx(0.004) and row["iterations"] == 2


def _reqs() -> list[ServingRequest]:
    return [
        ServingRequest("a", 0.0, 10, 2, 4, 0),
        ServingRequest("b", 30.0, 20, 3, 0, 8),
        ServingRequest("c", 12.0, 5, 1, hash_ids=(7,)),
    ]


def test_with_arrivals_zero_trace_and_speedup() -> None:
    reqs = _reqs()
    zero = with_arrivals(reqs, ArrivalsSpec(process="zero", speedup=4.0), seed=0)
    assert [r.arrival_ms for r in zero] == [0.0, 0.0, 0.0]
    same = with_arrivals(reqs, ArrivalsSpec(process="trace"), seed=0)
    assert list(same) == reqs
    double = with_arrivals(reqs, ArrivalsSpec(process="trace", speedup=2.0), seed=0)
    assert [r.arrival_ms for r in double] == [0.0, 15.0, 6.0]  # queue order kept
    slow = with_arrivals(reqs, ArrivalsSpec(process="trace", speedup=0.25), seed=0)
    assert [r.arrival_ms for r in slow] == [0.0, 120.0, 48.0]
    for out in (zero, double, slow):  # only the times change
        assert [(r.rid, r.prompt_tokens, r.max_new_tokens) for r in out] == [
            ("a", 10, 2),
            ("b", 20, 3),
            ("c", 5, 1),
        ]
        assert [(r.l1_cached_tokens, r.l2_cached_tokens, r.hash_ids) for r in out] == [
            (4, 0, None),
            (0, 8, None),
            (0, 0, (7,)),
        ]


@pytest.mark.skipif(not TRACE.is_file(), reason="the Mooncake trace is not here")
@pytest.mark.parametrize("speedup", [1.0, 4.0])
def test_real_trace_timestamps_are_the_arrivals(cli, speedup) -> None:
    limit = 30
    stamps = [json.loads(x)["timestamp"] for x in TRACE.read_text().splitlines()[:limit]]
    res = cli(
        "admit",
        str(ROOT / "configs/admit/serving_mooncake.yaml"),
        f"admit.workload.path={TRACE}",
        f"admit.workload.limit={limit}",
        f"admit.arrivals.speedup={speedup}",
    )
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    reqs = _lines(run / "requests.jsonl")
    assert [r["arrival_ms"] for r in reqs] == approx([t / speedup for t in stamps])
    assert len(set(stamps)) > 1  # the slice has distinct times
    assert all(r["admitted_ms"] is None or r["admitted_ms"] >= r["arrival_ms"] for r in reqs)
