"""Values that pass a sign check but are absurd in size or precision, each with the one line
cpkv must answer (exit 2, nothing written): the physical bounds of the config schema, the
rules across its keys, the bounds of the trace and profile readers and the clock's range.

Run by ``tests/hostile/test_bounds.py`` through the same runner as the hostile matrix
(:mod:`tests.hostile.cases`).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from tests.helpers.paths import SHARED
from tests.hostile.cases import OUT, SERVING, Case, _copy, _template

SERVE = ("admit", "admit.mode=serving")
BIG = 10**20  # a JSON integer (not a float) too large for any token count


def _serving(tag: str, *items: str, expect: tuple[str, ...]) -> Case:
    return Case(f"bounds/serving/{tag}", (*SERVE, *items, "-o", OUT), expect)


def config_bound_cases() -> list[Case]:
    return [
        _serving("rate-below-the-clock", "admit.arrivals.process=poisson",
                 "admit.arrivals.rate_rps=2e-15", expect=("admit.arrivals.rate_rps", ">= 1e-09", "2**53")),
        _serving("rate-denormal", "admit.arrivals.process=poisson", "admit.arrivals.rate_rps=5e-324",
                 expect=("admit.arrivals.rate_rps",)),
        _serving("slo-below-the-resolution", "admit.slo.ttft_ms=1e-6",
                 expect=("admit.slo.ttft_ms", ">= 0.001", "1 µs")),
        _serving("gpu-slower-than-any", "admit.cost.gpu_spec.peak_tflops=1e-300",
                 expect=("admit.cost.gpu_spec.peak_tflops", ">= 1")),
        _serving("gpu-faster-than-any", "admit.cost.gpu_spec.hbm_gb_per_s=1e12",
                 expect=("admit.cost.gpu_spec.hbm_gb_per_s", "<= 100000")),
        _serving("hidden-huge", "admit.cost.model_shape.hidden=1e300",
                 expect=("admit.cost.model_shape.hidden", "<= 131072")),
        _serving("kv-heads-above-heads", "admit.cost.model_shape.kv_heads=64",
                 expect=("admit.cost.model_shape.kv_heads", "at most the 32 attention heads")),
        _serving("kv-heads-not-a-divisor", "admit.cost.model_shape.kv_heads=5",
                 expect=("admit.cost.model_shape.kv_heads", "must divide the 32")),
        _serving("tp-splits-kv-heads-unevenly", "admit.cost.model_shape.heads=48",
                 "admit.cost.model_shape.kv_heads=12", "admit.cost.tp=8",
                 expect=("admit.cost.tp", "12 KV heads")),
        _serving("gemm-efficiency-above-peak", "admit.cost.calibration.gemm_flops_eff=1e30",
                 expect=("admit.cost.calibration.gemm_flops_eff", "<= 1")),
        _serving("graph-bucket-above-the-pool", "admit.kv.capacity_blocks=1000",
                 "admit.serving.cuda_graph_buckets=[1,1000000000]",
                 expect=("admit.serving.cuda_graph_buckets", "1000 requests", "capacity_blocks")),
        _serving("graph-bucket-above-max-running", "admit.kv.capacity_blocks=1000",
                 "admit.max_running_requests=8", "admit.serving.cuda_graph_buckets=[1,16]",
                 expect=("admit.serving.cuda_graph_buckets", "8 requests", "max_running_requests")),
        _serving("negative-preemption-threshold", "admit.enable_priority_scheduling=true",
                 "admit.priority_scheduling_preemption_threshold=-1",
                 expect=("admit.priority_scheduling_preemption_threshold", ">= 0", "equal priority")),
        _serving("router-setting-of-another-router", "admit.cluster.instances=2",
                 "admit.cluster.router=round_robin", "admit.cluster.cache_threshold=0.5",
                 expect=("admit.cluster.cache_threshold", "router prefix_aware", "round_robin")),
        _serving("tree-size-of-another-router", "admit.cluster.instances=2",
                 "admit.cluster.router=least_requests", "admit.cluster.max_tree_blocks=16",
                 expect=("admit.cluster.max_tree_blocks", "prefix_aware")),
        _serving("denormal-iteration-weight", "admit.policy=conservative",
                 "admit.iteration.weights.prefill=1e-320",
                 expect=("admit.iteration.weights.prefill", ">= 0.001")),
        _serving("pool-beyond-int32", "admit.kv.capacity_blocks=1000000000", "admit.kv.block_size=64",
                 expect=("admit.kv.capacity_blocks", "2147483647")),
        _serving("timeout-beyond-the-clock", "admit.serving.queue_timeout_ms=1e300",
                 expect=("admit.serving.queue_timeout_ms", "2**53")),
        _serving("timeline-buckets-huge", "admit.serving.timeline_points=1000000000",
                 expect=("admit.serving.timeline_points", "<= 100000", "8K screen")),
        _serving("timeline-buckets-of-many-instances", "admit.cluster.instances=4096",
                 "admit.serving.timeline_points=100000",
                 expect=("admit.serving.timeline_points", "4096 instances", "GiB")),
        Case("bounds/alloc-l1/page-size-memory", ("alloc", "l1", "alloc_l1.page_size=1e9", "-o", OUT),
             ("page_size", "request_pages", "GiB")),
        Case("bounds/alloc-l1/page-size-beyond-int64", ("alloc", "l1", "alloc_l1.page_size=1e15", "-o", OUT),
             ("alloc_l1.page_size", "beyond int64")),
    ]  # fmt: skip


def _trace_case(tag: str, line: dict, *expect: str) -> Case:
    return Case(
        f"bounds/trace/{tag}",
        (*SERVE, "admit.workload.source=trace", "admit.workload.path=t.jsonl", "-o", OUT),
        ("t.jsonl:1", *expect),
        files={"t.jsonl": json.dumps(line) + "\n"},
    )


def reader_cases() -> list[Case]:
    line = {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}
    azure = f"arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,{BIG}\n"
    late = {**line, "timestamp": 1e12}
    return [
        _trace_case("mooncake-output-length", {**line, "output_length": BIG}, "output_length", "2147483647"),
        _trace_case("mooncake-input-length", {**line, "input_length": BIG}, "input_length", "2147483647"),
        _trace_case("mooncake-timestamp", {**line, "timestamp": 1e300}, "timestamp", "2**53"),
        _trace_case("mooncake-cancel", {**line, "cancel_ms": 1e300}, "cancel_ms"),
        _trace_case("mooncake-hash", {**line, "hash_ids": [BIG * BIG]}, "hash_ids", "64-bit"),
        _trace_case("mooncake-priority", {**line, "priority": BIG * BIG}, "priority", "64-bit"),
        Case("bounds/trace/azure-output-length",
             (*SERVE, "admit.workload.source=trace", "admit.workload.format=azure_csv",
              "admit.workload.path=t.csv", "-o", OUT),
             ("t.csv:2", "num_decode_tokens", "2147483647"), files={"t.csv": azure}),
        Case("bounds/trace/stats-output-length", ("trace", "stats", "t.jsonl", "-o", OUT),
             ("t.jsonl:1", "output_length"), files={"t.jsonl": json.dumps({**line, "output_length": BIG}) + "\n"}),
        Case("bounds/jsonl/extend-tokens", (*SERVE, "admit.workload.source=jsonl", "admit.workload.path=r.jsonl", "-o", OUT),
             ("r.jsonl:1", "extend_tokens", "2147483647"),
             files={"r.jsonl": json.dumps({"rid": "a", "extend_tokens": BIG}) + "\n"}),
        Case("bounds/jsonl/arrival", (*SERVE, "admit.workload.source=jsonl", "admit.workload.path=r.jsonl", "-o", OUT),
             ("r.jsonl:1", "arrival_ms", "2**53"),
             files={"r.jsonl": json.dumps({"rid": "a", "extend_tokens": 8, "arrival_ms": 1e300}) + "\n"}),
        Case("bounds/clock/trace-too-slow",
             (*SERVE, "admit.workload.source=trace", "admit.workload.path=t.jsonl",
              "admit.arrivals.speedup=0.001", "-o", OUT),
             ("admit.arrivals.speedup", "2**53", "a speedup above 0.111"),
             files={"t.jsonl": json.dumps(late) + "\n"}),
    ]  # fmt: skip


PROFILE = SHARED / "data" / "gpu_profiles" / "h100_meta-llama_Llama-2-7b-hf" / "mlp.csv"
"""The measured profile the fit-cost cases edit (they are skipped where it is not)."""
NEEDS_PROFILE: set[str] = set()
"""The names of the cases made from :data:`PROFILE`."""


def _profile(edit) -> str:
    """Vidur's Llama-2-7B H100 profile (``mlp.csv``) with ``edit(header, row)`` applied to
    every row; a one-row profile when ``edit`` returns None for the rest ("" where the
    profile is not here)."""
    if not PROFILE.is_file():
        return ""
    rows = list(csv.reader(PROFILE.read_text().splitlines()))
    header, out = rows[0], io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for k, row in enumerate(rows[1:]):
        edited = edit(header, list(row), k)
        if edited is not None:
            writer.writerow(edited)
    return out.getvalue()


def _medians(value: str):
    def edit(header, row, k):
        return [
            value if name.endswith(".median") else v for name, v in zip(header, row, strict=True)
        ]

    return edit


def _no_heads(header, row, k):
    row[header.index("n_head")] = "0"
    return row


def profile_cases() -> list[Case]:
    folder = "h100_acme_Model-7B"

    def case(tag: str, edit, *expect: str) -> Case:
        NEEDS_PROFILE.add(f"bounds/fit-cost/{tag}")
        return Case(f"bounds/fit-cost/{tag}", ("fit-cost", "--profile", folder), (folder, *expect),
                    files={f"{folder}/mlp.csv": _profile(edit)})  # fmt: skip

    return [
        case("all-zero-times", _medians("0"), "mlp.csv:2", "sum to 0 ms"),
        case("huge-times", _medians("1e300"), "mlp.csv:2", "<= 100000 ms"),
        case("zero-heads", _no_heads, "mlp.csv:2", "n_head", ">= 1"),
        case("one-row", lambda h, row, k: row if k == 0 else None, "1 token counts", "more than 5"),
        Case("bounds/fit-cost/points-one-row", ("fit-cost", "p.jsonl"), ("p.jsonl", "1 points", "more than 1"),
             files={"p.jsonl": '{"time_us": 100}\n'}),
        Case("bounds/fit-cost/points-huge", ("fit-cost", "p.jsonl"), ("p.jsonl:1", "prefill_tokens", "2**53"),
             files={"p.jsonl": '{"prefill_tokens": 1e300, "time_us": 100}\n'}),
    ]  # fmt: skip


DEAD_PID = 2**22 + 1
"""A PID no process has: Linux hands out PIDs up to ``pid_max``, at most 2**22."""
STALE = f"srch/.summary.json.tmp-{DEAD_PID}"
"""The temporary file a capacity search killed while writing its summary leaves."""


def capacity_search(folder: Path) -> None:
    """A finished capacity search at ``folder/srch`` (the grid's 8 requests, Poisson)."""

    def make(where: Path) -> Path:
        from cpkv.capacity.run import run_capacity

        (where / "c.yaml").write_text(SERVING)
        return run_capacity(str(where / "c.yaml"), root=where / "runs").path

    _copy(_template(("capacity",), make), folder / "srch")


def _search_with(path: str, text: str):
    """A setup: a finished capacity search whose file ``path`` (under it) holds ``text``."""

    def setup(folder: Path) -> None:
        capacity_search(folder)
        (folder / path).write_text(text)

    return setup


def capacity_bound_cases() -> list[Case]:
    ok = {"c.yaml": SERVING}
    damaged_result = {
        "truncated": ('{"capacity_version": 1, "searches": [{"points": [{"lo', ("capacity.json:1", "not valid JSON")),
        "a-list": ("[1, 2]", ("capacity.json", "malformed cpkv capacity result", "list")),
        "another-kind": ('{"schema_version": 1, "rows": []}', ("capacity.json", "'searches' is not a list")),
        "nan": ('{"searches": [{"points": [{"load": NaN}]}]}', ("capacity.json", "NaN")),
        "point-not-a-number": ('{"searches": [{"points": [{"load": 1, "attainment_pct": "all"}]}]}',
                               ("capacity.json", "searches[0].points[0].attainment_pct", "not a number")),
    }  # fmt: skip
    plots = [
        Case(f"bounds/plot/capacity-json-{tag}", ("plot", "srch"), expect,
             setup=_search_with("srch/capacity.json", text))
        for tag, (text, expect) in damaged_result.items()
    ]  # fmt: skip
    return [
        Case("bounds/capacity/slo-no-load-can-meet", ("capacity", "c.yaml", "admit.slo.ttft_ms=1e-6",
             "--growth", "1000", "-o", OUT), ("admit.slo.ttft_ms", "1 µs"), files=ok),
        Case("bounds/capacity/slo-of-1us-ends-below-range-within-the-clock",
             ("capacity", "c.yaml", "admit.kv.capacity_blocks=4096", "admit.slo.ttft_ms=0.001",
              "--growth", "1000", "-o", OUT),
             code=0, files=ok, stdout_has=("below range",), keeps=(OUT,)),
        Case("bounds/capacity/start-underflows", ("capacity", "c.yaml", "--start", "1e-300", "-o", OUT),
             ("admit.arrivals.rate_rps", ">= 1e-09"), files=ok),
        *plots,
        Case("bounds/plot/sweep-summary-truncated", ("plot", "srch"), ("srch", "summary.json", "cpkv capacity --resume"),
             setup=_search_with("srch/summary.json", '{"points": [')),
        Case("bounds/capacity/resume-sweeps-a-killed-writers-temp-file", ("capacity", "--resume", "srch"),
             code=0, setup=_search_with(STALE, '{"points": '), keeps=("srch",), gone=(STALE,)),
    ]  # fmt: skip


def bound_cases() -> list[Case]:
    cases = config_bound_cases() + reader_cases() + profile_cases() + capacity_bound_cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases
