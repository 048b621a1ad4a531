"""`cpkv admit` end to end: run directories, tick table, ticks.jsonl, configs, bad input."""

from __future__ import annotations

import importlib.util
import json

import yaml

from cpkv.core.config import load_config
from tests.helpers.paths import REPO, check_printed

ROOT = REPO


def test_default_run_is_the_seed_grid(cli) -> None:
    res = cli("admit")
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    assert res.output.strip().splitlines()[-1] == str(run) and run.name.endswith("_seed-grid")
    for name in (
        "config.yaml",
        "overrides.yaml",
        "meta.json",
        "results.json",
        "results.txt",
        "ticks.jsonl",
    ):
        assert (run / name).is_file(), name
    doc = cli.results(run)
    assert doc["kind"] == "admit" and [r["tick"] for r in doc["rows"]] == [0, 1]
    first = doc["rows"][0]
    # 7 requests fit; g7 (4096 L1 + 4096 L2 + 2048 new) is refused by the memory budget
    assert first["accepted"].split(", ")[-1] == "g6_4096_4096_128"
    assert (first["stopped_on_rid"], first["stopped_result"], first["stopped_budget"]) == (
        "g7_4096_4096_2048", "NO_TOKEN", "rem_total_tokens",
    )  # fmt: skip
    assert doc["summary"]["requests_admitted"] == 8 and doc["summary"]["stops_by_budget"] == {
        "rem_total_tokens": 1
    }
    assert "duration_us" in doc["columns"]["timing"]
    check_printed(run, res.output)
    assert "stopped_budget" in (run / "results.txt").read_text().splitlines()[0]


def test_ticks_jsonl_has_every_field(cli) -> None:
    assert cli("admit", "admit.chunked_prefill_size=1024").exit_code == 0
    (run,) = cli.run_dirs()
    lines = [json.loads(line) for line in (run / "ticks.jsonl").read_text().splitlines()]
    assert len(lines) == len(cli.results(run)["rows"])
    for key in (
        "tick", "accepted", "stopped_on_rid", "stopped_result", "stopped_budget", "log_hit_tokens",
        "log_input_tokens", "cp_total_extend_tokens", "cp_total_cached_tokens",
        "allocator_available_after_tick", "load_back_events", "rem_total_tokens", "cur_rem_tokens",
        "rem_input_tokens", "rem_chunk_tokens", "duration_us",
    ):  # fmt: skip
        assert key in lines[0], key
    events = [e for t in lines for e in t["load_back_events"]]
    assert events and set(events[0]) >= {"rid", "requested_tokens", "paged_tokens", "loaded_tokens",
                                         "quota_tokens", "available_before_tokens", "available_after_tokens"}  # fmt: skip
    accepted = [a for t in lines for a in t["accepted"]]
    assert any(a["chunked"] for a in accepted) and any(a["continuation"] for a in accepted)
    assert all(a["extend_tokens"] <= 1024 for a in accepted)


def test_seed_jsonl_config(cli, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the config names its JSONL relative to the repository root
    res = cli("admit", "configs/admit/seed_jsonl.yaml")
    assert res.exit_code == 0, res.output
    (row,) = cli.results(cli.run_dirs()[0])["rows"]
    # r0: 40320 L1 + 128; r1: 32768 L2 loaded back + 512 (seed README example)
    assert row["accepted"] == "r0, r1" and row["stopped_result"] == "queue_exhausted"
    assert (row["cp_total_cached_tokens"], row["cp_total_extend_tokens"]) == (73088, 640)
    assert row["allocator_available_after_tick"] == 200_000 - 32768


def test_configs_load_and_seed_grid_is_the_default() -> None:
    grid = load_config("admit", ROOT / "configs/admit/seed_grid.yaml").resolved
    assert grid == load_config("admit").resolved
    jsonl = load_config("admit", ROOT / "configs/admit/seed_jsonl.yaml").experiment.admit
    assert jsonl.cp.max_total_cached_tokens == 131072 and jsonl.available_tokens == 200_000


def test_same_config_same_results_apart_from_timings(cli) -> None:
    for _ in range(2):
        assert cli("admit", "admit.page_size=16", "admit.chunked_prefill_size=2048").exit_code == 0
    a, b = cli.run_dirs()

    def strip(text):
        return [
            {k: v for k, v in json.loads(x).items() if k != "duration_us"}
            for x in text.splitlines()
        ]

    assert strip((a / "ticks.jsonl").read_text()) == strip((b / "ticks.jsonl").read_text())
    timing = set(cli.results(a)["columns"]["timing"])

    def rows(run):
        return [{k: v for k, v in r.items() if k not in timing} for r in cli.results(run)["rows"]]

    assert rows(a) == rows(b)


def test_print_config(cli) -> None:
    res = cli("admit", "--print-config", "admit.cp.max_batch_requests=4")
    assert res.exit_code == 0 and cli.run_dirs() == []
    cfg = yaml.safe_load(res.output)["admit"]
    assert list(cfg)[:4] == ["backend", "policy", "mode", "workload"]
    assert cfg["cp"]["max_batch_requests"] == 4 and cfg["workload"]["grid"]["extend_tokens"] == [
        128,
        2048,
    ]


def test_bad_input_is_one_line_and_no_run_dir(cli, tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"rid":"a","extend_tokens":1}\n{"rid":"b","extend_tokens":0}\n')
    cases = [
        (
            ["admit.workload.source=jsonl", f"admit.workload.path={bad}"],
            f"{bad}:2: field 'extend_tokens'",
        ),
        (["admit.page_size=0"], "admit.page_size: must be > 0"),
        (["admit.mode=replay"], "admit.mode: unknown value 'replay' (allowed: passes, serving)"),
        (["admit.cp.max_batch_requests=0"], "admit.cp.max_batch_requests"),
        (["admit.workload.source=jsonl"], "admit.workload.path"),
    ]
    for args, message in cases:
        res = cli("admit", *args)
        assert res.exit_code == 2, (args, res.output)
        assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert cli.run_dirs() == []


def test_sglang_backend_refuses_cp_or_missing_sglang(cli) -> None:
    res = cli("admit", "admit.backend=sglang")
    assert res.exit_code == 2 and cli.run_dirs() == []
    if importlib.util.find_spec("sglang") is None:
        assert "sglang" in res.stderr and "install" in res.stderr
    else:
        assert "admit.cp.enabled" in res.stderr


def test_admit_does_not_import_torch(tmp_path) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from cpkv.cli import app\n"
        f"r = CliRunner().invoke(app, ['admit', '-o', {str(tmp_path)!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(sorted(m for m in ('torch', 'numpy', 'sglang') if m in sys.modules))\n"
    )
    import os

    with_plots = "['numpy']" if _has_matplotlib() else "[]"  # matplotlib needs numpy, not torch
    for plots, expected in (("0", "[]"), ("1", with_plots)):
        env = {**os.environ, "CPKV_PLOTS": plots}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        )
        assert out.stdout.strip() == expected


def test_headline_summarises_the_ticks(cli) -> None:
    res = cli("admit")
    assert res.exit_code == 0, res.output
    doc = cli.results(cli.run_dirs()[0])
    rows, head = doc["rows"], doc["summary"]["headline"]
    assert head["ticks"] == len(rows)
    assert head["requests_admitted"] == sum(r["admitted"] for r in rows)
    assert head["first_batch_requests"] == len(rows[0]["accepted"].split(", "))


def test_a_request_that_never_fits_ends_the_run_with_a_note(cli, tmp_path) -> None:
    """50,000 tokens cannot fit 20,000 even with each tick's prompts released: the run stops
    after the tick that admitted nothing and says which request and budget, and why."""
    path = tmp_path / "q.jsonl"
    path.write_text('{"rid":"small","extend_tokens":100}\n{"rid":"huge","extend_tokens":50000}\n')
    res = cli("admit", "admit.workload.source=jsonl", f"admit.workload.path={path}",
              "admit.available_tokens=20000", "admit.release_each_tick=true",
              "admit.chunked_prefill_size=null")  # fmt: skip
    assert res.exit_code == 0, res.output
    s = cli.results(cli.run_dirs()[0])["summary"]
    assert s["requests_admitted"] == 1 and s["requests_waiting"] == 1
    assert "1 request still waits (request huge stopped on rem_total_tokens)" in res.output
    assert "can never be admitted" in res.output


def test_an_empty_selection_is_an_error_not_an_empty_run(cli, tmp_path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    res = cli("admit", "admit.workload.source=jsonl", f"admit.workload.path={empty}")
    assert res.exit_code == 2 and res.stderr.strip().count("\n") == 0
    assert f"{empty} holds no request" in res.stderr
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
    )
    res = cli("admit", "admit.workload.source=trace", f"admit.workload.path={trace}",
              "admit.workload.start=1")  # fmt: skip
    assert res.exit_code == 2 and "start/limit select no request" in res.stderr
    assert cli.run_dirs() == []


def test_an_output_root_that_is_a_file_is_one_line(cli, tmp_path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    for args in (["admit"], ["alloc", "host", "alloc_host.request_pages=[8]"]):
        res = cli(*args, "-o", str(afile))
        assert res.exit_code == 2, res.output
        assert (
            res.stderr.strip()
            == f"cpkv: error: {afile}: cannot hold run directories (not a directory)"
        )
    assert afile.read_text() == "not a folder\n"


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None
