"""No output file of a run holds NaN or Infinity: every ``.json`` and ``.jsonl`` file of a few
runs of each mode parses with a strict JSON reader; a writer handed a non-finite number
refuses it, naming the file and line."""

from __future__ import annotations

import math

import pytest

from cpkv.core.files.jsonl import json_lines
from tests.helpers.paths import MOONCAKE_TRACE
from tests.helpers.strict_json import read_outputs, strict_json

SERVING = ("admit.mode=serving", "admit.kv.capacity_blocks=4096")
RUNS = {
    "passes": (),
    "serving": SERVING,
    "serving-nothing-finishes": ("admit.mode=serving", "admit.kv.capacity_blocks=1"),
    "serving-blocks-poisson": (*SERVING, "admit.policy=optimistic", "admit.kv.capacity_blocks=600",
                               "admit.arrivals.process=poisson", "admit.arrivals.rate_rps=50",
                               "admit.serving.policy_metrics=true"),
    "serving-linear": (*SERVING, "admit.cost.kind=linear", "admit.cost.fixed_us=0",
                       "admit.cost.prefill_token_us=0", "admit.cost.decode_request_us=0",
                       "admit.cost.context_token_us=0", "admit.cost.l2_load_gb_per_s=null"),
    "cluster-trace": (*SERVING, "admit.workload.source=trace", f"admit.workload.path={MOONCAKE_TRACE}",
                      "admit.workload.limit=40", "admit.cluster.instances=2",
                      "admit.cluster.router=prefix_aware", "admit.serving.trace_events=true"),
}  # fmt: skip


NEEDS_TRACE = {"cluster-trace"}
PARAMS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            name in NEEDS_TRACE and not MOONCAKE_TRACE.is_file(), reason="no Mooncake trace"
        ),
    )
    for name in RUNS
]


@pytest.mark.parametrize("name", PARAMS)
def test_every_output_file_is_strict_json(cli, name: str) -> None:
    res = cli("admit", *RUNS[name])
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    docs = read_outputs(run)
    assert "results.json" in docs and len(docs) >= 2
    summary = docs["results.json"]["summary"]
    if summary.get("mode") == "serving":
        lines = docs["requests.jsonl"]
        assert len(lines) == docs["results.json"]["rows"][0]["requests"]


def test_a_strict_reader_refuses_what_python_writes_for_nan() -> None:
    with pytest.raises(AssertionError, match="x.json holds NaN"):
        strict_json('{"a": NaN}', "x.json")
    with pytest.raises(AssertionError, match="holds -Infinity"):
        strict_json("[-Infinity]", "y.json")


def test_a_jsonl_writer_refuses_a_non_finite_number() -> None:
    assert json_lines([{"a": 1.5}, {"b": None}], "t.jsonl") == '{"a":1.5}\n{"b":null}\n'
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(
            RuntimeError, match=r"internal error: t.jsonl:2 would hold NaN or Infinity"
        ):
            json_lines([{"a": 1.0}, {"t_s": bad}], "t.jsonl")
