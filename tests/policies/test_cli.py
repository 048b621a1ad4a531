"""`cpkv admit` with seed 004's policies: configs, run directories, growth.jsonl, bad input."""

from __future__ import annotations

import json

import pytest

from tests.helpers.paths import REPO

ROOT = REPO
BLOCKS = "configs/admit/seed004_blocks.yaml"


@pytest.fixture
def at_root(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the configs name their JSONL relative to the repository root


def only_run(cli) -> dict:
    (run,) = cli.run_dirs()
    return cli.results(run)


def test_conservative_seed_example(cli, at_root) -> None:
    res = cli("admit", BLOCKS)
    assert res.exit_code == 0, res.output
    doc = only_run(cli)
    assert [(r["rid"], r["need_blocks"], r["admitted"]) for r in doc["rows"]] == [
        ("A", 3, True),
        ("B", 2, False),
    ]
    assert (doc["summary"]["policy"], doc["summary"]["reserved_blocks"]) == ("conservative", 3)
    assert doc["columns"]["identity"] == ["rid", "prompt_tokens", "max_new_tokens"]


def test_optimistic_seed_example_writes_the_growth_trace(cli, at_root) -> None:
    assert cli("admit", BLOCKS, "admit.policy=optimistic").exit_code == 0
    (run,) = cli.run_dirs()
    events = [json.loads(x) for x in (run / "growth.jsonl").read_text().splitlines()]
    assert {"step": 2, "rid": "A", "event": "preempted", "used_blocks": 2} in events
    assert cli.results(run)["summary"]["preempted_rids"] == ["A"]


def test_iteration_default_block_is_the_seed_example(cli, at_root) -> None:
    assert cli("admit", "configs/admit/seed004_iteration.yaml").exit_code == 0
    rows = only_run(cli)["rows"]
    assert [
        (r["decode_tokens"], r["prefill_tokens"], r["remaining_prompt_tokens"]) for r in rows
    ] == [
        (2, 4, 8),
        (2, 4, 4),
        (2, 4, 0),
    ]


def test_block_policies_read_prefill_workloads_by_fill_length(cli) -> None:
    # grid: 1 request of 4096 L1 + 0 L2 + 128 extend = 4224 tokens, max_new 128 -> 272 blocks of 16
    args = [
        "admit.policy=conservative",
        "admit.workload.grid.l1_cached_tokens=[4096]",
        "admit.workload.grid.l2_cached_tokens=[0]",
        "admit.workload.grid.extend_tokens=[128]",
        "admit.kv.block_size=16",
        "admit.kv.capacity_blocks=272",
    ]
    assert cli("admit", *args).exit_code == 0
    (row,) = only_run(cli)["rows"]
    assert (row["prompt_tokens"], row["max_new_tokens"], row["need_blocks"], row["admitted"]) == (
        4224,
        128,
        272,
        True,
    )


def test_same_config_same_bytes(cli, at_root) -> None:
    for _ in range(2):
        assert (
            cli(
                "admit", BLOCKS, "admit.policy=optimistic", "admit.kv.victim=least_progress"
            ).exit_code
            == 0
        )
    a, b = cli.run_dirs()
    for name in ("results.json", "growth.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            (BLOCKS, "admit.policy=optimistic", "admit.kv.capacity_blocks=2"),
            "admit.kv.capacity_blocks: the requests need 3 blocks",
        ),
        (
            ("admit.policy=iteration", "admit.iteration.chunk_tokens=0"),
            "admit.iteration.chunk_tokens: must be > 0",
        ),
        (
            ("admit.policy=iteration", "admit.iteration.budget_tokens=2"),
            "admit.iteration.budget_tokens: 2 leaves no room",
        ),
        ((BLOCKS, "admit.kv.victim=oldest"), "admit.kv.victim: unknown victim order 'oldest'"),
        (("admit.policy=greedy",), "admit.policy: unknown value 'greedy'"),
        (
            ("admit.policy=conservative", "admit.backend=sglang"),
            "admit.backend: 'sglang' runs only policy prefill_adder",
        ),
    ],
)
def test_user_errors_exit_2_with_one_line_and_no_run(cli, at_root, args, message) -> None:
    res = cli("admit", *args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert cli.run_dirs() == []


def test_bad_block_request_line_names_file_and_line(cli, tmp_path) -> None:
    path = tmp_path / "reqs.jsonl"
    path.write_text('{"rid": "a", "prompt_tokens": 3}\n{"rid": "b", "prompt_tokens": -1}\n')
    res = cli(
        "admit",
        "admit.policy=conservative",
        "admit.workload.source=jsonl",
        f"admit.workload.path={path}",
    )
    assert res.exit_code == 2
    assert f"{path}:2: field 'prompt_tokens' must be an integer >= 0, got -1" in res.stderr
    path.write_text('{"rid": "a", "prompt_tokens": 3, "extend_tokens": 1}\n')
    res = cli(
        "admit",
        "admit.policy=optimistic",
        "admit.workload.source=jsonl",
        f"admit.workload.path={path}",
    )
    assert res.exit_code == 2 and "unknown field 'extend_tokens' for a block request" in res.stderr
