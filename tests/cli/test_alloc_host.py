"""`cpkv alloc host` end to end: run directories, files, bad input, interruption."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from cpkv.core.config import load_config
from tests.helpers.paths import check_printed

SMALL = [
    "alloc_host.host_sizes_gb=[]",
    "alloc_host.host_pages=[600]",
    "alloc_host.repeat=3",
    "alloc_host.warmup=1",
]


def test_run_writes_the_run_directory_contract(cli) -> None:
    res = cli("alloc", "host", *SMALL, "alloc_host.request_pages=[1,8]")
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    assert res.output.strip().splitlines()[-1] == str(run)
    assert run.parent.parent == cli.root and run.name.endswith("_alloc-host")
    for name in ("config.yaml", "overrides.yaml", "meta.json", "results.json", "results.txt"):
        assert (run / name).is_file(), name
    assert not (run / "INCOMPLETE").exists()
    doc = cli.results(run)
    assert doc["schema_version"] == 1 and doc["kind"] == "alloc_host"
    # 1 pool x 2 request sizes x 3 patterns x 2 methods
    assert len(doc["rows"]) == 12
    assert set(doc["columns"]["timing"]) >= {"p50_us", "p99_us", "mean_us"}
    assert all(row["repeat"] == 3 for row in doc["rows"])
    meta = json.loads((run / "meta.json").read_text())
    for key in (
        "cpkv_version",
        "git",
        "python",
        "serving_engine",
        "torch",
        "device",
        "hostname",
        "cpu_model",
        "start_utc",
        "end_utc",
        "argv",
    ):
        assert key in meta, key
    assert meta["status"] == "complete"
    assert (
        yaml.safe_load((run / "overrides.yaml").read_text())[-1] == "alloc_host.request_pages=[1,8]"
    )
    check_printed(run, res.output)
    # the resolved config re-loads to the same experiment
    again = load_config("alloc_host", run / "config.yaml")
    assert again.resolved == yaml.safe_load((run / "config.yaml").read_text())
    assert again.experiment.alloc_host.request_pages == (1, 8)


def test_contiguous_ratio_on_fragmented_prefix(cli) -> None:
    res = cli(
        "alloc",
        "host",
        *SMALL,
        "alloc_host.request_pages=[8]",
        "alloc_host.patterns=[fragmented_prefix_later_run]",
    )
    assert res.exit_code == 0, res.output
    rows = {r["method"]: r for r in cli.results(cli.run_dirs()[0])["rows"]}
    assert rows["contiguous"]["contiguous_ratio"] == 1.0
    assert rows["fifo"]["contiguous_ratio"] == 0.0


def test_warm_protocol_and_free_op(cli) -> None:
    res = cli("alloc", "host", *SMALL, "alloc_host.request_pages=[8]", "alloc_host.protocol=warm",
              "alloc_host.ops=[alloc,free]", "alloc_host.patterns=[random_fragmented]")  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = cli.results(cli.run_dirs()[0])["rows"]
    assert sorted((r["method"], r["op"]) for r in rows) == [
        ("contiguous", "alloc"), ("contiguous", "free"), ("fifo", "alloc"), ("fifo", "free")
    ]  # fmt: skip
    assert all(r["protocol"] == "warm" and r["p50_us"] > 0 for r in rows)


def test_same_seed_same_rows_apart_from_timings(cli) -> None:
    for _ in range(2):
        assert cli("alloc", "host", *SMALL, "alloc_host.request_pages=[4]").exit_code == 0
    a, b = (cli.results(r) for r in cli.run_dirs())
    timing = set(a["columns"]["timing"]) | set(a["columns"]["samples"])
    strip = lambda doc: [{k: v for k, v in r.items() if k not in timing} for r in doc["rows"]]  # noqa: E731
    assert strip(a) == strip(b)


def test_print_config_prints_and_does_not_run(cli) -> None:
    res = cli("alloc", "host", "--print-config", "alloc_host.page_size=16")
    assert res.exit_code == 0
    cfg = yaml.safe_load(res.output)
    assert cfg["kind"] == "alloc_host" and cfg["alloc_host"]["page_size"] == 16
    assert cfg["alloc_host"]["host_sizes_gb"] == [220.0]
    assert cli.run_dirs() == []


def test_default_is_the_seed_example() -> None:
    block = load_config("alloc_host").experiment.alloc_host
    # 220e9 bytes / (100,000 bytes/token * 64 tokens/page) = 34,375 pages
    assert block.pool_pages() == [34375]
    assert block.request_pages == (1, 8, 64, 512)
    assert block.methods == ("fifo", "contiguous")
    assert len(block.patterns) == 3


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("alloc_host.pagesize=3", "alloc_host.pagesize: unknown key"),
        ("alloc_host.page_size=abc", "alloc_host.page_size: expected an integer"),
        ("alloc_host.page_size=-4", "alloc_host.page_size: must be > 0"),
        ("alloc_host.repeat=0", "alloc_host.repeat: must be > 0"),
        ("alloc_host.rounds=0", "alloc_host.rounds: must be > 0"),
        ("alloc_host.rounds=21", "alloc_host.rounds: 21 rounds cannot share 20 samples"),
        ("alloc_host.patterns=[zigzag]", "unknown value 'zigzag'"),
        ("alloc_host.methods=[best]", "allowed: fifo, contiguous"),
        ("alloc_host.impls=[turbo]", "alloc_host.impls"),
        ("alloc_host.protocol=hot", "allowed: cold, warm"),
        ("alloc_host.request_pages=1,8", "a list is written [a,b]"),
        ("alloc_host.host_sizes_gb=[-1]", "must be > 0"),
        ("nonsense", "nonsense: config file not found"),
        ("kind=alloc_l1", "override 'kind=alloc_l1': `cpkv alloc host` runs kind 'alloc_host'"),
        ("kind=bogus", "allowed: alloc_host"),
        ("seed=99999999999999999999999", "seed: 99999999999999999999999 does not fit 64 bits"),
        ("seed=1.5", "seed: expected an integer"),
        ("=3", "expected KEY=VALUE"),
    ],
)
def test_bad_overrides_exit_2_with_one_line(cli, override: str, needle: str) -> None:
    res = cli("alloc", "host", override)
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert needle in err
    assert len(err.splitlines()) == 1 and "Traceback" not in res.output
    assert cli.run_dirs() == []


def test_request_larger_than_pool(cli) -> None:
    res = cli(
        "alloc",
        "host",
        "alloc_host.host_sizes_gb=[]",
        "alloc_host.host_pages=[4]",
        "alloc_host.request_pages=[8]",
    )
    assert res.exit_code == 2
    assert "request_pages: 8 pages is larger than the pool (4 pages)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert cli.run_dirs() == []


def test_host_pages_fall_back_to_the_seeds_sizes() -> None:
    """With neither sizes nor pages, the seed's --host-pages default: 8192, 16384, 32768."""
    from cpkv.alloc.host.schema import AllocHostBlock

    block = AllocHostBlock(host_sizes_gb=(), host_pages=())
    assert block.pool_pages() == [8192, 16384, 32768]
    assert AllocHostBlock(host_sizes_gb=(), host_pages=(100,)).pool_pages() == [100]


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed")
def test_sglang_impl_without_sglang_is_one_line(cli) -> None:
    res = cli("alloc", "host", *SMALL, "alloc_host.impls=[sglang]")
    assert res.exit_code == 2 and "sglang" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert cli.run_dirs() == []


def test_bad_files(cli, tmp_path) -> None:
    missing = cli("alloc", "host", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 2 and "config file not found" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: alloc_host\nalloc_host:\n  page_size: [1,\n")
    res = cli("alloc", "host", str(broken))
    assert res.exit_code == 2 and f"{broken}:" in res.stderr and "invalid YAML" in res.stderr
    typo = tmp_path / "typo.yaml"
    typo.write_text("kind: alloc_host\nname: x\nalloc_host:\n  page_size: 64\n  repeet: 3\n")
    res = cli("alloc", "host", str(typo))
    assert res.exit_code == 2 and f"{typo}:5: alloc_host.repeet: unknown key" in res.stderr
    other = tmp_path / "other.yaml"
    other.write_text("kind: admit\nname: x\n")
    res = cli("alloc", "host", str(other))
    assert res.exit_code == 2 and "kind" in res.stderr and "admit" in res.stderr
    assert cli.run_dirs() == []


def test_config_file_and_override_precedence(cli, tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("kind: alloc_host\nname: mine\nalloc_host:\n  page_size: 16\n  repeat: 2\n")
    res = cli("alloc", "host", str(path), "--print-config", "alloc_host.repeat=3")
    cfg = yaml.safe_load(res.output)
    assert (
        cfg["name"] == "mine"
        and cfg["alloc_host"]["page_size"] == 16
        and cfg["alloc_host"]["repeat"] == 3
    )


def test_ctrl_c_leaves_an_incomplete_run_without_results(cli, monkeypatch) -> None:
    import cpkv.alloc.host.bench as bench

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_case", interrupted)
    res = cli("alloc", "host", *SMALL)
    assert res.exit_code == 130
    (run,) = cli.run_dirs()
    assert (run / "INCOMPLETE").exists() and not (run / "results.json").exists()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "incomplete" and "interrupted" in meta["error"]


def test_failure_while_writing_results_marks_the_run_failed(cli, monkeypatch) -> None:
    import cpkv.runs.runner as runner

    def broken(*args, **kwargs):
        raise TypeError("Object of type int64 is not JSON serializable")

    monkeypatch.setattr(runner, "render", broken)
    with pytest.raises(TypeError):
        cli("alloc", "host", *SMALL, "alloc_host.request_pages=[1]")
    (run,) = cli.run_dirs()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "failed" and "JSON serializable" in meta["error"]
    assert (run / "INCOMPLETE").exists() and not (run / "results.json").exists()


@pytest.mark.parametrize("protocol", ["cold", "warm"])
def test_rounds_split_the_samples_and_keep_the_answers(cli, spy, protocol) -> None:
    """``rounds`` passes over every case several times and merges each row's samples."""
    import cpkv.alloc.host.bench as bench
    from cpkv.alloc.rows import round_shares

    assert round_shares(7, 3) == [3, 2, 2] and round_shares(5, 5) == [1] * 5
    calls = spy(bench, "run_case")  # the repeat share is run_case's last argument
    base = ["alloc", "host", *SMALL[:2], "alloc_host.request_pages=[8]", "alloc_host.repeat=7",
            "alloc_host.patterns=[fragmented_prefix_later_run]", "alloc_host.ops=[alloc,free]",
            f"alloc_host.protocol={protocol}"]  # fmt: skip
    assert cli(*base, "alloc_host.rounds=3").exit_code == 0
    (run,) = cli.run_dirs()
    rows = cli.results(run)["rows"]
    cases = len(rows) // 2  # alloc and free rows
    assert sorted(args[-1] for args in calls) == sorted([3, 2, 2] * cases)
    assert all(row["repeat"] == 7 for row in rows)
    if protocol == "cold":  # every sample starts from the layout: the same answers as one round
        assert cli(*base, "alloc_host.rounds=1").exit_code == 0
        one = cli.results([d for d in cli.run_dirs() if d != run][0])["rows"]
        keys = ("impl", "method", "op", "contiguous_ratio", "repeat")
        assert [[r[k] for k in keys] for r in rows] == [[r[k] for k in keys] for r in one]


def test_vs_fifo_is_each_rows_p50_and_p99_over_fifos(cli) -> None:
    """vs_fifo_p50 / vs_fifo_p99: this row's p50 (p99) over the FIFO row's of the same impl and
    case, measured in the same run; 1.0 on the FIFO rows; both columns in the table."""
    res = cli(
        "alloc",
        "host",
        *SMALL,
        "alloc_host.request_pages=[4,8]",
        "alloc_host.impls=[reference,fast]",
    )
    assert res.exit_code == 0, res.output
    doc = cli.results(cli.run_dirs()[0])
    assert doc["table_columns"][-2:] == ["vs_fifo_p50", "vs_fifo_p99"]
    key = lambda r: (r["impl"], r["pattern"], r["request_pages"])  # noqa: E731
    fifo = {key(r): r for r in doc["rows"] if r["method"] == "fifo"}
    assert len(fifo) == len(doc["rows"]) / 2
    for row in doc["rows"]:
        base = fifo[key(row)]
        assert row["vs_fifo_p50"] == row["p50_us"] / base["p50_us"]
        assert row["vs_fifo_p99"] == row["p99_us"] / base["p99_us"]
        if row["method"] == "fifo":
            assert (row["vs_fifo_p50"], row["vs_fifo_p99"]) == (1.0, 1.0)
    # one method only: no ratio columns
    assert cli("alloc", "host", *SMALL, "alloc_host.methods=[fifo]").exit_code == 0
    one = cli.results(cli.run_dirs()[1])
    assert "vs_fifo_p50" not in one["table_columns"] and one["rows"][0]["vs_fifo_p50"] is None
