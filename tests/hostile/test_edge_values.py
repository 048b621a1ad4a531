"""A property over the config schema: every numeric key of every kind, set to a value at an
edge (0, tiny, denormal, huge, NaN, inf, at and just past each bound of its type), either gets
one clear line with exit 2 or gives a finite, self-consistent result: every output file
parses as strict JSON (no NaN or Infinity), a serving run accounts for each of its requests
once with times that never go backwards, a passes run admits or leaves waiting each request.

The keys and their bounds come from the schema itself (:func:`cpkv.core.schema.keys.leaves`), so
a new key is covered as soon as it exists. Each example sets one key on one of a few small
base runs (the passes mode; the serving mode with the prefill adder, a block policy, Poisson
arrivals, the linear cost model, two instances behind the prefix-aware router, a 2P1D
deployment, a trace;
the allocator benches; the trace commands). Keys whose valid values scale the work (a
repeat count, a pool of pages) are tried only at values a quick run can take and past their
bounds (:data:`SCALE`).

CI runs :data:`EXAMPLES` examples (half a minute on 2 idle cores, a minute on busy ones);
before a release run many more::

    CPKV_EDGE_EXAMPLES=5000 python -m pytest tests/hostile/test_edge_values.py
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cpkv.cli import app
from cpkv.core.kinds import KINDS
from cpkv.core.schema.keys import Leaf, leaves
from tests.helpers.paths import MOONCAKE_TRACE
from tests.helpers.strict_json import read_outputs

EXAMPLES = int(os.environ.get("CPKV_EDGE_EXAMPLES", "500"))
TRACE_LINES = 20

SKIPPED = ("seed",)
"""Keys checked elsewhere: the seed's own range (``check_seed``)."""
SCALE = (
    "*.repeat", "*.warmup", "*.rounds", "*.host_pages", "*.physical_pages", "*.host_sizes_gb",
    "*.request_pages", "*.cp_size", "*.bytes_per_token", "*.page_size", "*.prefix.tokens",
    "*.prefix.groups", "*.synthetic.count", "admit.iteration.prompt_tokens", "trace.limit",
    "admit.serving.timeline_points",
)  # fmt: skip
"""Keys whose valid values scale the work (a million repeats is a valid, long run): tried at
small values and past their bounds only."""
SMALL = 64


@dataclass(frozen=True)
class Base:
    """A quick run of one kind: its command line before the overrides."""

    name: str
    kind: str
    args: tuple[str, ...]


SERVING = ("admit", "admit.mode=serving", "admit.kv.capacity_blocks=4096")
BASES = (
    Base("passes", "admit", ("admit",)),
    Base("serving", "admit", SERVING),
    Base("serving-blocks", "admit", (*SERVING, "admit.policy=conservative")),
    Base("serving-poisson", "admit", (*SERVING, "admit.arrivals.process=poisson")),
    Base("serving-linear", "admit", (*SERVING, "admit.cost.kind=linear")),
    Base("serving-cluster", "admit", (*SERVING, "admit.cluster.instances=2",
                                      "admit.cluster.router=prefix_aware")),
    Base("serving-disagg", "admit", (*SERVING, "admit.cluster.prefill={instances: 2}",
                                     "admit.cluster.decode={instances: 1}")),
    Base("serving-trace", "admit", (*SERVING, "admit.workload.source=trace",
                                    "admit.workload.path={trace}")),
    Base("alloc-host", "alloc_host", ("alloc", "host", "alloc_host.host_sizes_gb=[]",
                                      "alloc_host.host_pages=[4096]", "alloc_host.request_pages=[8]",
                                      "alloc_host.repeat=1", "alloc_host.warmup=0")),
    Base("alloc-l1", "alloc_l1", ("alloc", "l1", "alloc_l1.physical_pages=[256]", "alloc_l1.cp_size=2",
                                  "alloc_l1.request_pages=[8]", "alloc_l1.repeat=1",
                                  "alloc_l1.warmup=0")),
    Base("trace-stats", "trace_stats", ("trace", "stats", "{trace}")),
    Base("trace-curve", "trace_curve", ("trace", "curve", "{trace}")),
)  # fmt: skip


def numeric_leaves(kind: str) -> list[Leaf]:
    out = []
    for leaf in leaves(KINDS.get(kind).config_cls()):
        if leaf.type in (int, float) and leaf.key not in SKIPPED:
            out.append(leaf)
    return out


LEAVES = {b.kind: numeric_leaves(b.kind) for b in BASES}
NAN, INF = math.nan, math.inf


def edge_values(leaf: Leaf) -> list[Any]:
    """The values tried for ``leaf``: the usual edges, and each bound, just inside and out."""
    values: list[Any] = [
        0,
        -1,
        1,
        2,
        0.5,
        5e-324,
        1e-300,
        1e-9,
        1e300,
        2**63,
        -(2**63),
        NAN,
        INF,
        -INF,
    ]
    for bound in leaf.ranges:
        for b in (bound.low, bound.high):
            if b is None:
                continue
            if leaf.type is int and float(b).is_integer():
                values += [int(b) - 1, int(b), int(b) + 1]
            else:
                values += [b, math.nextafter(b, -INF), math.nextafter(b, INF)]
    if any(fnmatch(leaf.key, pattern) for pattern in SCALE):
        values = [v for v in values if not _fits(leaf, v) or abs(v) <= SMALL]
    return values


def _fits(leaf: Leaf, value: Any) -> bool:
    """Whether the schema would take ``value`` for ``leaf`` (by type and bounds alone)."""
    if isinstance(value, float) and not math.isfinite(value):
        return False
    if leaf.type is int and not float(value).is_integer():
        return False
    return all(b.problem(value) is None for b in leaf.ranges)


def _shown(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    return str(value)


@st.composite
def examples(draw) -> tuple[Base, Leaf, Any]:
    base = draw(st.sampled_from(BASES))
    leaf = draw(st.sampled_from(LEAVES[base.kind]))
    value = draw(st.sampled_from(edge_values(leaf)))
    return base, leaf, value


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    if not MOONCAKE_TRACE.is_file():
        pytest.skip("the Mooncake trace is not here")
    path = tmp_path_factory.mktemp("edge") / "t.jsonl"
    with MOONCAKE_TRACE.open() as f:
        path.write_text("".join(next(f) for _ in range(TRACE_LINES)))
    return path


def check_outputs(run: Path) -> None:
    """Every JSON output parses strictly; the run's results are self-consistent."""
    docs = read_outputs(run)
    results = docs["results.json"]
    if results["kind"] != "admit":
        return
    summary = results["summary"]
    if summary.get("mode") == "serving":
        _check_serving(results["rows"][0], docs["requests.jsonl"], docs.get("timeline.jsonl", []))
    else:
        assert summary["requests_admitted"] + summary["requests_waiting"] == summary["requests"]


def _check_serving(row: dict, lines: list[dict], timeline: list[dict]) -> None:
    assert row["requests"] == len(lines) == len({line["rid"] for line in lines})
    statuses = Counter(line["status"] for line in lines)
    assert statuses["finished"] == row["finished"] and statuses["rejected"] == row["rejected"]
    assert sum(statuses.values()) == row["requests"]
    for line in lines:
        stamps = [line[k] for k in ("arrival_ms", "admitted_ms", "first_token_ms", "finish_ms")]
        seen = [t for t in stamps if t is not None]
        assert seen == sorted(seen), line
        assert all(t >= 0 for t in seen), line
        for key in ("queue_ms", "ttft_ms", "tpot_ms", "e2e_ms"):
            assert line[key] is None or line[key] >= 0, line
    for series in {(p.get("pool"), p.get("instance")) for p in timeline}:
        starts = [p["t_s"] for p in timeline if (p.get("pool"), p.get("instance")) == series]
        assert starts == sorted(starts), series


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(example=examples())
def test_an_edge_value_is_refused_in_one_line_or_gives_a_finite_result(example, trace) -> None:
    base, leaf, value = example
    shown = _shown(value)
    item = f"{leaf.key}=[{shown}]" if leaf.is_list else f"{leaf.key}={shown}"
    root = Path(tempfile.mkdtemp(prefix="cpkv-edge-"))
    try:
        args = [a.replace("{trace}", str(trace)) for a in base.args]
        res = CliRunner().invoke(
            app, [*args, item, "-o", str(root)], env={"CPKV_PLOTS": "0"}, catch_exceptions=True
        )
        where = f"{base.name}: {item}"
        assert res.exception is None or isinstance(res.exception, SystemExit), (
            f"{where}: {type(res.exception).__name__}: {res.exception}"
        )
        assert res.exit_code in (0, 2), f"{where}: exit {res.exit_code}: {res.output[-500:]}"
        if res.exit_code == 2:
            lines = [line for line in res.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("cpkv: error: "), (
                f"{where}: {res.stderr}"
            )
            return
        runs = sorted(p.parent for p in root.rglob("results.json"))
        assert runs, f"{where}: exit 0 without a run"
        for run in runs:
            check_outputs(run)
    finally:
        shutil.rmtree(root, ignore_errors=True)
