"""A disaggregated deployment (admit.cluster.prefill / decode / link), end to end through
``cpkv admit``: handoff times derived by hand on the linear cost model, the decode side's
SGLang rule and the prefill side's held KV by hand, 1P1D over an instant link against the
colocated instance, conservation of requests and bytes, and the routing's determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.paths import MOONCAKE_TRACE

LINEAR = [
    "admit.mode=serving", "admit.cost.kind=linear", "admit.cost.fixed_us=1000",
    "admit.cost.prefill_token_us=1", "admit.cost.decode_request_us=10",
    "admit.cost.context_token_us=0.5", "admit.cost.kv_bytes_per_token=1000",
    "admit.cost.l2_load_gb_per_s=null", "admit.kv.block_size=16", "admit.kv.capacity_blocks=4096",
]  # fmt: skip
"""An iteration takes 1000 + prefill tokens + 10 x decoding requests + 0.5 x context tokens
(us); a token's KV is 1000 bytes; blocks of 16 tokens."""
PD = ["admit.cluster.prefill={instances: 1}", "admit.cluster.decode={instances: 1}"]
SLOW_LINK = ["admit.cluster.link.gb_per_s=1", "admit.cluster.link.latency_us=7"]
"""1e3 bytes per us (1000 us for a 1000-token prompt's KV) and 7 us."""


def _workload(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _req(i: int, prompt: int, max_new: int, at_ms: float = 0.0) -> dict:
    return {"rid": f"r{i}", "extend_tokens": prompt, "max_new_tokens": max_new, "arrival_ms": at_ms}


def _run(cli, tmp_path: Path, rows: list[dict], *extra: str) -> Path:
    before = set(cli.run_dirs())
    res = cli(
        "admit", "admit.workload.source=jsonl",
        f"admit.workload.path={_workload(tmp_path, rows)}", *LINEAR, *extra,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = set(cli.run_dirs()) - before
    return run


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]


def _summary(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())["summary"]


def test_one_request_hand_derived(cli, tmp_path) -> None:
    run = _run(cli, tmp_path, [_req(0, 1000, 4)], *PD, *SLOW_LINK)
    (line,) = _lines(run)
    # prefill: 1000 + 1000 tokens + 0.5 x 1000 context = 2500 us; the KV (1e6 bytes) goes
    # over the wire in 1000 us, lands 7 us later: 3507; the idle decode instance takes it in
    # then; three decode steps read 1001, 1002, 1003 tokens: 1510.5 + 1511 + 1511.5 us
    assert line["handoff_ms"] == pytest.approx(2.5)
    assert line["kv_landed_ms"] == pytest.approx(3.507)
    assert line["first_token_ms"] == pytest.approx(3.507)
    assert line["finish_ms"] == pytest.approx(3.507 + 4.533)
    assert line["tpot_ms"] == pytest.approx(1.511)
    assert line["kv_bytes"] == 1_000_000
    assert (line["prefill_instance"], line["decode_instance"]) == (0, 0)
    link = _summary(run)["disaggregation"]["link"]
    assert (link["sends"], link["bytes"], link["busy_s"]) == (1, 1_000_000, pytest.approx(1e-3))
    split = _summary(run)["disaggregation"]["ttft_split_ms"]
    assert split["prefill"]["mean_ms"] == pytest.approx(2.5)
    assert split["transfer"]["mean_ms"] == pytest.approx(1.007)
    assert split["decode_wait"]["mean_ms"] == pytest.approx(0.0)


def test_sends_queue_on_the_link_and_landings_wait_for_the_decode_iteration(cli, tmp_path):
    run = _run(cli, tmp_path, [_req(0, 1000, 4), _req(1, 1000, 4)], *PD, *SLOW_LINK)
    a, b = _lines(run)
    # one prefill iteration of both: 1000 + 2000 + 0.5 x 2000 = 4000 us; r0's KV on the wire
    # 4000-5000, lands 5007; r1's waits for the wire: 5000-6000, lands 6007
    assert a["handoff_ms"] == b["handoff_ms"] == pytest.approx(4.0)
    assert a["kv_landed_ms"] == pytest.approx(5.007)
    assert b["kv_landed_ms"] == pytest.approx(6.007)
    # the decode instance runs r0's first step from 5007 to 6517.5 (1000 + 10 + 0.5 x 1001);
    # r1 landed during it and joins at the next iteration
    assert a["first_token_ms"] == pytest.approx(5.007)
    assert b["first_token_ms"] == pytest.approx(6.5175)


@pytest.mark.parametrize(("reserved", "joins_ms"), [(512, 9.540), (0, 6.5175)])
def test_decode_side_waits_by_sglang_rule(cli, tmp_path, reserved, joins_ms) -> None:
    # a decode pool of 2048 tokens: with r0 running (1001 tokens, 63 blocks: 1040 tokens free),
    # allocatable = 1040 - max(512 x 1, (1000 + 4) - 1002) = 528 < 1000 + 512: r1 waits for r0
    # to finish (5007 + 1510.5 + 1511 + 1511.5 = 9540); without the reserve, 1038 >= 1000: r1
    # joins at the iteration after its landing
    run = _run(
        cli, tmp_path, [_req(0, 1000, 4), _req(1, 1000, 4)], *PD, *SLOW_LINK,
        "admit.cluster.decode.capacity_blocks=128",
        f"admit.cluster.decode.reserved_decode_tokens={reserved}",
    )  # fmt: skip
    a, b = _lines(run)
    assert b["kv_landed_ms"] == pytest.approx(6.007)
    assert b["first_token_ms"] == pytest.approx(joins_ms)
    # r0 alone, or from 6517.5 beside r1: 1000 + 20 + 0.5 x (1002 + 1001), then 0.5 x 2005
    assert a["finish_ms"] == pytest.approx(9.540 if reserved else 10.5615)


def test_prefill_side_holds_the_kv_until_it_is_sent(cli, tmp_path) -> None:
    # a prefill pool of 100 blocks holds one 1000-token prompt (63 blocks), not two; r0's KV
    # takes 10,000 us on a 0.1 GB/s link: sent 2500-12500, lands 12507, when its blocks are
    # freed and r1 is admitted; r1's prefill ends 2500 us later
    run = _run(
        cli, tmp_path, [_req(0, 1000, 4), _req(1, 1000, 4)], *PD,
        "admit.cluster.prefill.capacity_blocks=100", "admit.cluster.link.gb_per_s=0.1",
        "admit.cluster.link.latency_us=7",
    )  # fmt: skip
    a, b = _lines(run)
    assert a["kv_landed_ms"] == pytest.approx(12.507)
    assert b["admitted_ms"] == pytest.approx(12.507)
    assert b["handoff_ms"] == pytest.approx(15.007)


def _spaced(n: int) -> list[dict]:
    """Requests far enough apart that none overlaps another on either side."""
    return [_req(i, 200 + 37 * i, 3 + i % 5, at_ms=100.0 * i) for i in range(n)]


TIMES = ("admitted_ms", "first_token_ms", "finish_ms", "ttft_ms", "tpot_ms", "e2e_ms")


def test_instant_link_is_the_colocated_timeline_when_requests_do_not_overlap(cli, tmp_path):
    rows = _spaced(12)
    colocated = _lines(_run(cli, tmp_path, rows))
    disagg = _lines(_run(cli, tmp_path, rows, *PD, "admit.cluster.link.kind=instant"))
    for c, d in zip(colocated, disagg, strict=True):
        for key in TIMES:
            assert d[key] == pytest.approx(c[key], rel=1e-12), (c["rid"], key)
        assert d["handoff_ms"] == pytest.approx(c["first_token_ms"])
        assert d["kv_landed_ms"] == d["handoff_ms"]


def test_instant_link_differs_from_colocated_when_prefill_meets_decode(cli, tmp_path):
    # r1's 8000-token prompt arrives while r0 decodes: the colocated instance computes it in
    # one of r0's decode iterations (13,000 us more for that token), the 1P1D deployment on
    # the other GPU; r0's decode is the same but for that iteration
    rows = [_req(0, 1000, 20), _req(1, 8000, 20, at_ms=5.0)]
    colocated = _lines(_run(cli, tmp_path, rows))
    disagg = _lines(_run(cli, tmp_path, rows, *PD, "admit.cluster.link.kind=instant"))
    assert colocated[0]["tpot_ms"] - disagg[0]["tpot_ms"] > 12.0 / 19


def _mixed(n: int) -> list[dict]:
    return [_req(i, 64 + (97 * i) % 900, 1 + (13 * i) % 9, at_ms=3.0 * i) for i in range(n)]


def test_requests_and_bytes_are_conserved(cli, tmp_path) -> None:
    rows = _mixed(120)
    run = _run(
        cli, tmp_path, rows, "admit.cluster.prefill={instances: 3, router: least_tokens}",
        "admit.cluster.decode={instances: 2, router: least_requests}", *SLOW_LINK,
    )  # fmt: skip
    lines = _lines(run)
    assert [x["rid"] for x in lines] == [r["rid"] for r in rows]
    assert all(x["status"] == "finished" for x in lines)
    handed = [x for x in lines if x["decode_instance"] is not None]
    # a request asking for one token ends on its prefill instance: nothing to send
    assert len(handed) == sum(1 for r in rows if r["max_new_tokens"] > 1)
    assert all(x["kv_bytes"] == 1000 * x["prompt_tokens"] for x in handed)
    summary = _summary(run)["disaggregation"]
    assert summary["link"]["bytes"] == sum(x["kv_bytes"] for x in handed)
    assert summary["link"]["sends"] == len(handed)
    prefill, decode = summary["prefill"]["per_instance"], summary["decode"]["per_instance"]
    assert sum(p["routed"] for p in prefill) == len(rows)
    assert sum(p["handed_off"] for p in prefill) == len(handed)
    assert sum(p["link_bytes"] for p in prefill) == summary["link"]["bytes"]
    assert sum(d["routed"] for d in decode) == len(handed) == sum(d["finished"] for d in decode)
    instances = [json.loads(x) for x in (run / "instances.jsonl").read_text().splitlines()]
    assert [(x["pool"], x["instance"]) for x in instances] == [
        ("prefill", 0), ("prefill", 1), ("prefill", 2), ("decode", 0), ("decode", 1),
    ]  # fmt: skip
    for x in handed:  # the TTFT is its parts
        assert x["handoff_ms"] <= x["kv_landed_ms"] <= x["first_token_ms"]


def test_the_same_seed_routes_the_same_way(cli, tmp_path) -> None:
    rows = _mixed(80)
    pools = [
        "admit.cluster.prefill={instances: 3, router: random}",
        "admit.cluster.decode={instances: 3, router: power_of_two}",
    ]
    first = _run(cli, tmp_path, rows, *pools)
    again = _run(cli, tmp_path, rows, *pools)
    other = _run(cli, tmp_path, rows, *pools, "seed=7")
    assert (first / "requests.jsonl").read_bytes() == (again / "requests.jsonl").read_bytes()

    def routes(run: Path) -> list[tuple]:
        return [(x["prefill_instance"], x["decode_instance"]) for x in _lines(run)]

    assert routes(other) != routes(first)


def test_trace_shows_the_handoff(cli, tmp_path) -> None:
    run = _run(
        cli, tmp_path, [_req(0, 1000, 4), _req(1, 1000, 4)], *PD, *SLOW_LINK,
        "admit.serving.trace_events=true",
    )  # fmt: skip
    events = json.loads((run / "trace.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {"prefill 0", "decode 0"}
    sends = [e for e in events if e.get("name") == "send"]
    assert [(e["ts"], e["dur"]) for e in sends] == [(4000.0, 1007.0), (5000.0, 1007.0)]
    flows = sorted((e["ph"], e["id"], e["pid"]) for e in events if e.get("cat") == "handoff"
                   and e["ph"] in "sf")  # fmt: skip
    assert flows == [("f", 0, 1), ("f", 1, 1), ("s", 0, 0), ("s", 1, 0)]
    parts = {e["name"] for e in events if e.get("cat") == "request" and e["ph"] == "b"}
    assert {"queued", "prefill", "transfer", "decode wait"} <= parts


@pytest.mark.skipif(not MOONCAKE_TRACE.is_file(), reason="no Mooncake trace")
def test_prefix_cache_and_cp_limits_on_the_prefill_pool(cli, tmp_path) -> None:
    before = set(cli.run_dirs())
    res = cli(
        "admit", "configs/admit/serving_disagg_mooncake.yaml",
        f"admit.workload.path={MOONCAKE_TRACE}", "admit.workload.limit=150",
        "admit.cp.enabled=true", "admit.cp.max_batch_requests=2",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = set(cli.run_dirs()) - before
    summary = _summary(run)
    assert summary["l1_hit_tokens"] > 0
    per = summary["disaggregation"]["prefill"]["per_instance"]
    assert all(p["l1_hit_pct"] is not None for p in per)
    assert summary["admission_stops"].get("cp_max_batch_requests", 0) > 0


BAD = [
    (["admit.cluster.prefill={instances: 1}"], "admit.cluster.decode"),
    ([*PD, "admit.cluster.instances=2"], "admit.cluster.instances"),
    ([*PD, "admit.engine=vllm"], "not engine vllm"),
    ([*PD, "admit.engine=sglang"], "admit.engine cpkv: a prefill-only mode"),
    ([*PD, "admit.policy=conservative"], "policy prefill_adder"),
    ([*PD, "admit.cluster.link.kind=carrier_pigeon"], "admit.cluster.link.kind"),
    ([*PD, "admit.cluster.link.kind=instant", "admit.cluster.link.gb_per_s=5"], "gb_per_s"),
    ([*PD, "admit.cluster.link.gb_per_s=-1"], "admit.cluster.link.gb_per_s"),
    ([*PD, "admit.cluster.prefill.instances=0"], "admit.cluster.prefill.instances"),
    ([*PD, "admit.cluster.decode.router=nearest"], "admit.cluster.decode.router"),
    ([*PD, "admit.cluster.prefill.cost.tp=2"], "admit.cluster.prefill.cost.tp"),
    ([*PD, "admit.cluster.decode.colour=blue"], "admit.cluster.decode.colour"),
    (["admit.cluster.link.kind=nvlink"], "admit.cluster.link"),
    ([*PD, "admit.serving.queue_timeout_ms=100"], "admit.cluster.prefill"),
]


@pytest.mark.parametrize(("extra", "named"), BAD)
def test_bad_input_is_one_line(cli, tmp_path, extra, named) -> None:
    res = cli(
        "admit", "admit.workload.source=jsonl",
        f"admit.workload.path={_workload(tmp_path, [_req(0, 100, 2)])}", *LINEAR, *extra,
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1, res.output
    assert named in lines[0], res.output


def test_closed_form_stretches_give_the_full_iterations_run(cli, tmp_path) -> None:
    # with trace events every iteration runs in full; without, the prefill side's quiet chunks
    # and the decode side's decode-only iterations run in closed form: the same decisions,
    # times equal but for rounding
    rows = [_req(i, 2000 + 311 * (i % 7), 30 + (17 * i) % 90, at_ms=4.0 * i) for i in range(60)]
    pools = [
        "admit.cluster.prefill={instances: 2}",
        "admit.cluster.decode={instances: 2, router: least_tokens}",
        "admit.chunked_prefill_size=1024",
        *SLOW_LINK,
    ]
    fast = _lines(_run(cli, tmp_path, rows, *pools))
    full = _lines(_run(cli, tmp_path, rows, *pools, "admit.serving.trace_events=true"))
    for a, b in zip(fast, full, strict=True):
        for key, value in a.items():
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=1e-9), (a["rid"], key)
            else:
                assert b[key] == value, (a["rid"], key)


def test_token_gaps_on_the_decode_side_are_the_clients(cli, tmp_path) -> None:
    # a finished request's gaps sum to finish - first token, one gap per token after the
    # first, whether or not it was preempted on the decode side (a tight pool, no reserve)
    rows = [_req(i, 1000, 40 + 7 * i, at_ms=0.5 * i) for i in range(12)]
    run = _run(
        cli, tmp_path, rows, *PD, "admit.cluster.decode.capacity_blocks=200",
        "admit.cluster.decode.reserved_decode_tokens=0",
    )  # fmt: skip
    summary, lines = _summary(run), _lines(run)
    assert sum(x["preemptions"] for x in lines) > 0
    done = [x for x in lines if x["status"] == "finished"]
    spans = sum(x["finish_ms"] - x["first_token_ms"] for x in done)
    gaps = sum(x["output_tokens"] - 1 for x in done)
    assert summary["itl_ms"]["mean"] == pytest.approx(spans / gaps, rel=1e-9)


def test_the_handoff_columns_write_each_value_as_json_does() -> None:
    """The columns that end a disaggregated run's lines, for a batch in the middle of the run,
    against each value written out one by one: ``repr(round(us / 1000, 6))`` for the times
    (null without a handoff), the instance numbers and bytes as integers, a request that
    ended on its prefill instance with a null decode instance."""
    import random

    import numpy as np

    from cpkv.serving.cluster.disagg.tallies import HandoffColumns, HandoffRecord

    rng = random.Random(7)
    record = HandoffRecord()
    prefill_of, decode_of, expected = [], [], []
    for index in range(300):
        prefill_of.append(rng.randrange(4))
        handed = rng.random() < 0.7
        decode_of.append(rng.randrange(3) if handed else -1)
        if handed:
            request = type("R", (), {"index": index, "handoff_us": rng.uniform(0, 5e9)})()
            landed = request.handoff_us + rng.choice([0.0, rng.uniform(0, 1e6), 1e-3])
            size = rng.randrange(1 << 40)
            record.handed(request, landed, size)
            tail = (
                f',"handoff_ms":{round(request.handoff_us / 1000.0, 6)!r},'
                f'"kv_landed_ms":{round(landed / 1000.0, 6)!r},"kv_bytes":{size}'
            )
        else:
            tail = ',"handoff_ms":null,"kv_landed_ms":null,"kv_bytes":0'
        decode = "null" if decode_of[-1] < 0 else str(decode_of[-1])
        expected.append(f',"prefill_instance":{prefill_of[-1]},"decode_instance":{decode}{tail}')
    columns = HandoffColumns(prefill_of, decode_of, record)
    first, n = 37, 250
    rows = np.concatenate(columns(first, n), axis=1)
    got = [row.tobytes().replace(b"\0", b"").decode() for row in rows]
    assert got == expected[first : first + n]
