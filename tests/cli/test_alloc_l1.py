"""`cpkv alloc l1` end to end: run directories, rows, contiguity, ratios, bad input."""

from __future__ import annotations

import json

import pytest
import yaml

from cpkv.core.config import load_config
from tests.helpers.paths import check_printed

SMALL = [
    "alloc_l1.physical_pages=[32]",
    "alloc_l1.request_pages=[4]",
    "alloc_l1.repeat=3",
    "alloc_l1.warmup=1",
]


def rows_of(cli):
    (run,) = cli.run_dirs()
    return cli.results(run)["rows"]


def test_run_writes_the_run_directory_contract(cli) -> None:
    res = cli("alloc", "l1", *SMALL, "alloc_l1.request_pages=[4,16]")
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    assert res.output.strip().splitlines()[-1] == str(run)
    assert run.name.endswith("_alloc-l1")
    for name in ("config.yaml", "overrides.yaml", "meta.json", "results.json", "results.txt"):
        assert (run / name).is_file(), name
    doc = cli.results(run)
    assert doc["schema_version"] == 1 and doc["kind"] == "alloc_l1"
    # 2 request sizes x 3 free patterns x 3 owner patterns x 2 impls x 1 op
    assert len(doc["rows"]) == 36
    assert set(doc["columns"]["timing"]) >= {"p50_us", "p99_us", "mean_us", "vs_reference"}
    assert {(r["impl"], r["method"]) for r in doc["rows"]} == {
        ("reference", "fifo"),
        ("reference", "contiguous"),
    }
    assert all(r["repeat"] == 3 and r["op"] == "alloc_pages" for r in doc["rows"])
    assert all(r["cp_size"] == 8 and r["device"] == "cpu" for r in doc["rows"])
    assert "vs_reference" not in doc["table_columns"]  # no fast rows: no ratio column
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["kind"] == "alloc_l1"
    check_printed(run, res.output)
    again = load_config("alloc_l1", run / "config.yaml")
    assert again.experiment.alloc_l1.request_pages == (4, 16)


def test_sorted_lanes_are_always_contiguous_like_the_seed(cli) -> None:
    res = cli("alloc", "l1", *SMALL, "alloc_l1.ops=[select_only,alloc_pages,stats]")
    assert res.exit_code == 0, res.output
    for row in rows_of(cli):
        # every page is free and every lane sorted: any prefix is physically consecutive;
        # stats select nothing, which the seed counts as not contiguous
        assert row["contiguous_ratio"] == (0.0 if row["op"] == "stats" else 1.0), row


def test_as_given_lanes_separate_fifo_from_contiguous(cli) -> None:
    res = cli(
        "alloc", "l1", *SMALL,
        "alloc_l1.lane_order=as_given",
        "alloc_l1.free_patterns=[owner_fragmented_later_run]",
        "alloc_l1.owner_patterns=[single_owner]",
        "alloc_l1.impls=[fifo,current,fast_fifo,fast_current]",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    ratios = {(r["impl"], r["method"]): r["contiguous_ratio"] for r in rows_of(cli)}
    # lane 0's list starts with ordinals 31, 29, 27, 25 (a descending stride-2 front): FIFO
    # takes them; the contiguous selector takes the lowest run, ordinals 0..3.
    assert ratios == {
        ("reference", "fifo"): 0.0,
        ("reference", "contiguous"): 1.0,
        ("fast", "fifo"): 0.0,
        ("fast", "contiguous"): 1.0,
    }


def test_fast_rows_get_the_ratio_to_the_reference(cli) -> None:
    res = cli(
        "alloc", "l1", *SMALL,
        "alloc_l1.impls=[fifo,fast_fifo]",
        "alloc_l1.ops=[stats,free_room_stats,select_only,alloc_pages,free]",
        "alloc_l1.protocol=warm",
        "alloc_l1.free_patterns=[random]",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    doc = cli.results(run)
    assert "vs_reference" in doc["table_columns"]
    rows = doc["rows"]
    assert len(rows) == 3 * 2 * 5
    for row in rows:
        assert row["protocol"] == "warm" and row["p50_us"] > 0
        ref = next(
            r for r in rows
            if r["impl"] == "reference"
            and (r["op"], r["pattern"]) == (row["op"], row["pattern"])
        )  # fmt: skip
        assert row["vs_reference"] == pytest.approx(ref["p50_us"] / row["p50_us"])
        assert row["contiguous_ratio"] == ref["contiguous_ratio"]  # same selections
    summary = doc["summary"]["vs_reference_p50"]
    assert set(summary) == {f"{op}/fifo" for op in ("stats", "free_room_stats", "select_only",
                                                     "alloc_pages", "free")}  # fmt: skip
    assert all(s["cases"] == 3 for s in summary.values())
    assert "note: fast vs reference p50, alloc_pages/fifo: median" in res.output


def test_same_seed_same_rows_apart_from_timings(cli) -> None:
    for _ in range(2):
        res = cli("alloc", "l1", *SMALL, "alloc_l1.impls=[contiguous,fast_contiguous]")
        assert res.exit_code == 0
    a, b = (cli.results(r) for r in cli.run_dirs())
    timing = set(a["columns"]["timing"]) | set(a["columns"]["samples"])

    def strip(doc):
        return [{k: v for k, v in r.items() if k not in timing} for r in doc["rows"]]

    assert strip(a) == strip(b)


def test_default_is_the_seed_example_on_cpu(cli) -> None:
    res = cli("alloc", "l1", "--print-config")
    assert res.exit_code == 0
    block = yaml.safe_load(res.output)["alloc_l1"]
    assert block["physical_pages"] == [8192, 32768]
    assert (block["cp_size"], block["page_size"]) == (8, 64)
    assert block["request_pages"] == [8, 64, 512]
    assert block["impls"] == ["fifo", "contiguous"] and block["ops"] == ["alloc_pages"]
    assert block["free_patterns"] == ["sequential", "owner_fragmented_later_run", "random"]
    assert block["owner_patterns"] == ["round_robin", "single_owner", "zigzag"]
    assert (block["free_room_ratio"], block["free_room_trigger_ratio"]) == (0.15, 0.05)
    assert (block["device"], block["protocol"], block["lane_order"]) == ("cpu", "cold", "sorted")
    assert (block["repeat"], block["warmup"]) == (20, 5)
    assert cli.run_dirs() == []


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("alloc_l1.cp_size=0", "alloc_l1.cp_size: must be > 0, got 0"),
        ("alloc_l1.page_size=-1", "alloc_l1.page_size: must be > 0"),
        ("alloc_l1.physical_pages=[0]", "alloc_l1.physical_pages: every value must be > 0"),
        (
            "alloc_l1.request_pages=[257]",
            "alloc_l1.request_pages: 257 pages is larger than the pool",
        ),
        ("alloc_l1.ops=[defrag]", "alloc_l1.ops: unknown value 'defrag'"),
        ("alloc_l1.free_patterns=[zigzag]", "alloc_l1.free_patterns: unknown value 'zigzag'"),
        ("alloc_l1.owner_patterns=[random]", "alloc_l1.owner_patterns: unknown value 'random'"),
        ("alloc_l1.impls=[turbo]", "alloc_l1.impls: unknown value 'turbo'"),
        ("alloc_l1.protocol=hot", "allowed: cold, warm"),
        ("alloc_l1.lane_order=shuffled", "allowed: sorted, as_given"),
        ("alloc_l1.device=tpu", "alloc_l1.device: 'tpu'"),
        ("alloc_l1.repeat=0", "alloc_l1.repeat: must be > 0"),
        ("alloc_l1.rounds=0", "alloc_l1.rounds: must be > 0"),
        ("alloc_l1.rounds=30", "alloc_l1.rounds: 30 rounds cannot share 20 samples"),
        ("alloc_l1.free_room_ratio=-0.1", "alloc_l1.free_room_ratio: must be >= 0"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli, override: str, needle: str) -> None:
    res = cli("alloc", "l1", "alloc_l1.physical_pages=[32]", "alloc_l1.request_pages=[4]", override)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert needle in err
    assert len(err.splitlines()) == 1 and "Traceback" not in res.output
    assert cli.run_dirs() == []


def test_cuda_without_cuda_exits_2(cli) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = cli("alloc", "l1", *SMALL, "alloc_l1.device=cuda")
    assert res.exit_code == 2
    assert "alloc_l1.device: 'cuda' requested but CUDA is not available" in res.stderr
    assert cli.run_dirs() == []


@pytest.mark.cuda
def test_cuda_run(cli) -> None:
    res = cli("alloc", "l1", *SMALL, "alloc_l1.device=cuda", "alloc_l1.impls=[fifo,fast_fifo]",
              "alloc_l1.ops=[select_only,alloc_pages,free]")  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = rows_of(cli)
    assert all(r["device"].startswith("cuda") and r["p50_us"] > 0 for r in rows)
    assert all(r["contiguous_ratio"] == 1.0 for r in rows)


def test_rounds_split_the_samples_and_keep_the_answers(cli, spy) -> None:
    """``rounds`` runs every case several times over and merges each row's samples: the
    rows, their sample counts and what they selected are those of one round."""
    from cpkv.alloc.l1 import bench as l1_bench

    assert l1_bench.round_shares(7, 3) == [3, 2, 2] and sum(l1_bench.round_shares(20, 6)) == 20
    calls = spy(l1_bench, "run_case")  # the repeat share is run_case's last argument
    ops = "alloc_l1.ops=[select_only,alloc_pages,free]"
    base = ["alloc", "l1", *SMALL[:2], "alloc_l1.repeat=7", "alloc_l1.warmup=1", ops]
    assert cli(*base, "alloc_l1.rounds=3").exit_code == 0
    (run,) = cli.run_dirs()
    rows = cli.results(run)["rows"]
    cases = len(rows) // 3  # three ops a case
    # each case once a round, 7 samples in all
    assert sorted(args[-1] for args in calls) == sorted([3, 2, 2] * cases)
    assert all(row["repeat"] == 7 for row in rows)
    assert cli(*base, "alloc_l1.rounds=1").exit_code == 0
    one = cli.results([d for d in cli.run_dirs() if d != run][0])["rows"]
    keys = ("impl", "method", "op", "pattern", "contiguous_ratio", "repeat")
    assert [[r[k] for k in keys] for r in rows] == [[r[k] for k in keys] for r in one]
