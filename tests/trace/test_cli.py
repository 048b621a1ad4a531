"""`cpkv trace stats` / `cpkv trace curve` end to end, and the `trace` workload source of admit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from cpkv.core.errors import ConfigError
from cpkv.core.schema import build
from cpkv.workload.request import Request
from cpkv.workload.sources import WorkloadSpec, load_workload
from tests.helpers.paths import MOONCAKE_TRACE, REPO

# block size 4: r0 blocks 1, 2 (4 + 4 tokens); r1 1, 2, 3 (4 + 4 + 2); r2 4, 5 (4 + 2)
ROWS = [
    {"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [1, 2]},
    {"timestamp": 1000, "input_length": 10, "output_length": 3, "hash_ids": [1, 2, 3]},
    {"timestamp": 3000, "input_length": 6, "output_length": 1, "hash_ids": [4, 5]},
]
SMALL = ["trace.block_size=4", "trace.cache.l1_tokens=4", "trace.cache.l2_tokens=8"]
MOONCAKE = MOONCAKE_TRACE


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_stats_writes_rows_and_summary(cli, trace_file) -> None:
    res = cli("trace", "stats", str(trace_file), *SMALL)
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    doc = cli.results(run)
    assert doc["kind"] == "trace_stats"
    rows = {r["setting"]: r for r in doc["rows"]}
    # unlimited: only r1 hits (blocks 1, 2: 8 of its 10 tokens): 8 / 24 prompt tokens
    assert rows["unlimited"]["cache_pct"] == pytest.approx(100 * 8 / 24)
    # L1 4 tokens, L2 8: after r0, L1 holds block 1 and L2 blocks 2, 1; r1 hits 1 in L1, 2 in L2
    conf = rows["configured"]
    assert (conf["l1_tokens"], conf["l2_tokens"]) == (4, 8)
    assert conf["l1_hit_pct"] == pytest.approx(100 * 4 / 24)
    assert conf["l2_hit_pct"] == pytest.approx(100 * 4 / 24)
    s = doc["summary"]
    assert (s["requests"], s["prompt_tokens"], s["input_mean_tokens"], s["input_p50_tokens"]) == (
        3,
        24,
        8,
        8,
    )
    assert s["arrival_span_ms"] == 3000 and s["arrival_rate_per_s"] == pytest.approx(2 / 3)
    assert (s["unique_blocks"], s["working_set_tokens"]) == (5, 16)
    assert s["trace"] == str(trace_file)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["trace"]["path"] == str(trace_file) and config["trace"]["cache"]["l1_tokens"] == 4


def test_curve_rows_and_plot(cli, trace_file) -> None:
    cli.plots = True
    res = cli("trace", "curve", str(trace_file), "trace.block_size=4", "curve.fractions=[0.25,1.0]")
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    rows = cli.results(run)["rows"]
    # working set 16 tokens: L1 of 4 keeps only block 1 for r1 (4 tokens); 16 never evicts
    assert [(r["capacity_pct"], r["l1_tokens"], r["l2_tokens"]) for r in rows] == [
        (25.0, 4, 0),
        (100.0, 16, 0),
    ]
    assert [r["cache_pct"] for r in rows] == pytest.approx([100 * 4 / 24, 100 * 8 / 24])
    if importlib.util.find_spec("matplotlib") is not None:
        assert (run / "plots" / "capacity_curve.png").stat().st_size > 0


def test_same_config_same_results(cli, trace_file) -> None:
    for _ in range(2):
        assert cli("trace", "stats", str(trace_file), *SMALL).exit_code == 0
    a, b = ((run / "results.json").read_bytes() for run in cli.run_dirs())
    assert a == b


def test_print_config_and_yaml_config(cli, trace_file, tmp_path) -> None:
    res = cli("trace", "stats", str(trace_file), "--print-config")
    assert res.exit_code == 0 and cli.run_dirs() == []
    cfg = yaml.safe_load(res.output)
    assert cfg["kind"] == "trace_stats" and cfg["trace"]["path"] == str(trace_file)
    assert cfg["trace"]["cache"] == {
        "l1_tokens": 2097152,
        "l2_tokens": None,
        "hicache_ratio": 2.0,
        "page_size": 1,
    }
    conf = tmp_path / "t.yaml"
    conf.write_text(
        yaml.safe_dump(
            {"kind": "trace_curve", "trace": {"block_size": 4}, "curve": {"fractions": [0.5]}}
        )
    )
    res = cli("trace", "curve", str(conf), str(trace_file), "--print-config")
    assert res.exit_code == 0, res.output
    cfg = yaml.safe_load(res.output)
    assert cfg["curve"]["fractions"] == [0.5] and cfg["trace"]["path"] == str(trace_file)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "trace.path: missing; give the trace file: cpkv trace stats PATH"),
        (
            ["{trace}", "trace.format=sharegpt"],
            "trace.format: unknown trace format 'sharegpt' (allowed: mooncake, azure_csv)",
        ),
        (
            ["{trace}", "trace.cache.l1_tokens=100", "trace.cache.l2_tokens=50"],
            "trace.cache.l2_tokens: 50 is smaller",
        ),
        (
            ["{trace}", "trace.cache.hicache_ratio=0.5"],
            "trace.cache.hicache_ratio: must be null or a number >= 1",
        ),
        (
            ["{trace}"],
            "field 'hash_ids' has 2 entries; it must have ceil(input_length / block_size)",
        ),
        (["{trace}", "other.jsonl"], "one trace per run"),
        (["{trace}", "trace.block_size=4", "trace.start=7"], "no request of"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli, trace_file, args, needle) -> None:
    argv = [a.replace("{trace}", str(trace_file)) for a in args]
    res = cli("trace", "stats", *argv)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert cli.run_dirs() == []


def test_malformed_line_names_file_and_line(cli, trace_file) -> None:
    trace_file.write_text(trace_file.read_text() + '{"timestamp": 5, "input_length": "x"}\n')
    res = cli("trace", "curve", str(trace_file), "trace.block_size=4")
    assert res.exit_code == 2
    assert f"{trace_file}:4: field 'input_length' must be an integer >= 1, got 'x'" in res.stderr


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"trace not found at {MOONCAKE}")
def test_stats_on_the_mooncake_trace(cli) -> None:
    res = cli("trace", "stats", str(MOONCAKE))
    assert res.exit_code == 0, res.output
    rows = {r["setting"]: r for r in cli.results(cli.run_dirs()[0])["rows"]}
    assert abs(rows["unlimited"]["cache_pct"] - 66) <= 2  # Mooncake FAST'25 Table 2
    assert (
        0 < rows["configured"]["l2_hit_pct"]
        and rows["configured"]["cache_pct"] < rows["unlimited"]["cache_pct"]
    )


def test_trace_workload_source(trace_file) -> None:
    spec = build(WorkloadSpec, {"source": "trace", "path": str(trace_file), "block_size": 4,
                                "start": 1, "cache": {"l1_tokens": None}})  # fmt: skip
    # from r1 on, cold: r1 misses, r2 (blocks 4, 5) misses too
    assert load_workload(spec) == (
        Request("r1", 0, 0, 10, 3, 0, 1000.0),
        Request("r2", 0, 0, 6, 1, 0, 3000.0),
    )
    spec = build(WorkloadSpec, {"source": "trace", "path": str(trace_file), "block_size": 4,
                                "cache": {"l1_tokens": 4, "l2_tokens": 8}})  # fmt: skip
    assert [(r.l1_cached_tokens, r.l2_cached_tokens, r.extend_tokens) for r in load_workload(spec)] == [
        (0, 0, 8), (4, 4, 2), (0, 0, 6)
    ]  # fmt: skip
    with pytest.raises(
        ConfigError, match="admit.workload.path: the trace source needs a trace file path"
    ):
        load_workload(build(WorkloadSpec, {"source": "trace"}))
    with pytest.raises(ConfigError, match="admit.workload.format: unknown trace format 'csv'"):
        load_workload(
            build(WorkloadSpec, {"source": "trace", "path": str(trace_file), "format": "csv"})
        )
    with pytest.raises(ConfigError, match=r"cache.l2_tokens: 5 is smaller"):
        build(WorkloadSpec, {"source": "trace", "cache": {"l1_tokens": 10, "l2_tokens": 5}})


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="the Mooncake trace is not in ../shared/data")
def test_admit_runs_on_the_whole_trace(cli, monkeypatch) -> None:
    """cpkv admit end to end on the trace config: every request of the trace is admitted
    exactly once, in trace order, and the first is the trace's first (an empty cache: no hit);
    with the seed's hold model the run stops early and says why."""
    monkeypatch.chdir(REPO)
    res = cli("admit", "configs/admit/trace_mooncake.yaml")
    assert res.exit_code == 0, res.output
    doc = cli.results(cli.run_dirs()[0])
    s = doc["summary"]
    assert s["workload"] == "trace" and s["requests"] == 3993
    assert s["requests_admitted"] == 3993 and s["requests_waiting"] == 0
    admitted = [rid for row in doc["rows"] for rid in row["accepted"].split(", ") if rid]
    assert admitted == [f"r{i}" for i in range(3993)]  # FCFS: trace order, each once
    assert doc["rows"][0]["log_hit_tokens"] == 0
    assert "stopped after tick" not in res.output
    held = cli("admit", "configs/admit/trace_mooncake.yaml", "admit.release_each_tick=false")
    assert held.exit_code == 0, held.output
    s = cli.results(sorted(cli.run_dirs())[-1])["summary"]
    assert s["requests_waiting"] > 0 and s["requests_admitted"] + s["requests_waiting"] == 3993
    assert f"{s['requests_waiting']} requests still wait" in held.output
    assert "admit.release_each_tick=true" in held.output
