"""`cpkv show` and `cpkv ls`: re-rendering saved results, listing runs and sweeps."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import yaml

from cpkv.runs.headline import headline
from cpkv.runs.rundir import load_run
from cpkv.sweep import run_sweep
from tests.helpers.paths import SAVED_RUNS
from tests.helpers.sweep_fake_kind import fake_kind  # noqa: F401  (fixture)

DATA = SAVED_RUNS
BASE = DATA / "host_base"


def test_show_every_format(cli) -> None:
    fixture = json.loads((BASE / "results.json").read_text())
    res = cli("show", str(BASE), output=False)
    assert res.exit_code == 0
    header = res.output.splitlines()[0].split()
    assert header == fixture["table_columns"]
    assert "100.00" in res.output and "random_fragmented" in res.output
    md = cli("show", str(BASE), "--format", "markdown", output=False).output
    assert md.splitlines()[0].startswith("| impl ") and md.splitlines()[1].startswith("|--")
    doc = json.loads(cli("show", str(BASE), "-f", "json", output=False).output)
    assert doc["rows"] == fixture["rows"]
    rows = list(
        csv.DictReader(io.StringIO(cli("show", str(BASE), "-f", "csv", output=False).output))
    )
    assert [float(r["p50_us"]) for r in rows] == [10.0, 100.0] and list(rows[0]) == fixture[
        "table_columns"
    ]
    res = cli("show", str(BASE), "--columns", "method,stdev_us", output=False)
    assert res.output.splitlines()[0].split() == ["method", "stdev_us"]


def test_show_bad_input(cli) -> None:
    assert cli("show", str(BASE), "--format", "xml", output=False).exit_code == 2
    assert cli("show", str(BASE), "--columns", "nope", output=False).exit_code == 2
    res = cli("show", str(DATA / "old_schema"), output=False)
    assert res.exit_code == 2 and "schema_version 0 is not supported" in res.output


def test_headline_by_hand() -> None:
    record = load_run(BASE).record
    h = headline(record)
    # table order: p50_us, p95_us, p99_us first; timing metrics use the geometric mean
    assert list(h) == ["gmean_p50_us", "gmean_p95_us", "gmean_p99_us"]
    assert math.isclose(h["gmean_p50_us"], math.sqrt(10.0 * 100.0))
    assert math.isclose(h["gmean_p99_us"], math.sqrt(13.0 * 120.0))
    ticks = headline(load_run(DATA / "admit_ticks").record)
    assert ticks == {
        "mean_accepted": 2.0,
        "mean_extend_tokens": 4096.0,
        "mean_rem_tokens": 22000 / 3,
    }


def test_ls_lists_runs_and_sweeps_with_status(cli, tmp_path: Path, fake_kind) -> None:  # noqa: F811
    root = tmp_path / "exp"
    day = root / "2026-05-01"
    shutil.copytree(BASE, day / "10-00-00-000000_base")
    failed = day / "11-00-00-000000_failed"
    shutil.copytree(BASE, failed)
    (failed / "results.json").unlink()
    (failed / "INCOMPLETE").write_text("x")
    meta = json.loads((failed / "meta.json").read_text())
    (failed / "meta.json").write_text(
        json.dumps(
            {**meta, "status": "failed", "error": "boom", "start_utc": "2026-05-01T11:00:00Z"}
        )
    )
    cfg = tmp_path / "e.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"kind": "sweeptest", "name": "echo", "sweep": {"sweeptest.scale": [1.0, 2.0]}}
        )
    )
    sweep = run_sweep([str(cfg)], root=root).path
    res = cli("ls", str(root), output=False)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    header = ["time", "type", "name", "kind", "status", "overrides", "headline", "path"]
    assert lines[0].split() == header
    entries = json.loads(cli("ls", str(root), "-f", "json", output=False).output)
    assert [(e["type"], e["name"], e["kind"], e["status"], e["overrides"], e["headline"]) for e in entries] == [
        ("run", "host_base", "alloc_host", "complete", "", "gmean_p50_us=31.62"),
        ("run", "host_base", "alloc_host", "failed", "", "boom"),
        ("sweep", "echo", "sweeptest", "complete", "sweeps scale", "2 points: 2 complete"),
    ]  # fmt: skip
    doc = json.loads(cli("ls", str(root), "--points", "-f", "json", output=False).output)
    assert [e["type"] for e in doc] == ["run", "run", "sweep", "point", "point"]
    assert doc[3]["path"].startswith(str(sweep))
    assert [
        e["kind"]
        for e in json.loads(
            cli("ls", str(root), "--kind", "sweeptest", "-f", "json", output=False).output
        )
    ] == ["sweeptest"]
    csv_rows = list(
        csv.DictReader(io.StringIO(cli("ls", str(root), "-f", "csv", output=False).output))
    )
    assert [r["status"] for r in csv_rows] == ["complete", "failed", "complete"]
    markdown = cli("ls", str(root), "-f", "markdown", output=False).output.splitlines()
    assert [c.strip() for c in markdown[0].strip("|").split("|")] == header
    assert set(markdown[1].replace("|", "")) <= {"-", " "}  # a separator row, then one per entry
    assert [c.strip() for c in markdown[3].strip("|").split("|")][4:7] == ["failed", "", "boom"]
    assert (
        "no runs under"
        in cli(
            "ls", str(tmp_path / "e.yaml").replace("e.yaml", ""), "--kind", "admit", output=False
        ).output
    )
    assert cli("ls", str(tmp_path / "missing"), output=False).exit_code == 2


def test_show_a_sweep_renders_its_summary(cli, tmp_path: Path, fake_kind) -> None:  # noqa: F811
    cfg = tmp_path / "e.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"kind": "sweeptest", "name": "echo", "sweep": {"sweeptest.scale": [1.0, 2.0]}}
        )
    )
    sweep = run_sweep([str(cfg)], root=tmp_path / "exp").path
    res = cli("show", str(sweep), output=False)
    assert res.output == (sweep / "summary.txt").read_text()
    rows = list(
        csv.DictReader(io.StringIO(cli("show", str(sweep), "-f", "csv", output=False).output))
    )
    # headline of kind sweeptest: mean tokens over ticks 0..2 at scale s = 10 * s * 2
    assert [(r["scale"], float(r["mean_tokens"])) for r in rows] == [("1.0", 20.0), ("2.0", 40.0)]


def test_show_columns_of_a_sweep(cli, tmp_path: Path, fake_kind) -> None:  # noqa: F811
    cfg = tmp_path / "e.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"kind": "sweeptest", "name": "echo", "sweep": {"sweeptest.scale": [1.0, 2.0]}}
        )
    )
    sweep = run_sweep([str(cfg)], root=tmp_path / "exp").path
    res = cli("show", str(sweep), "-c", "point,scale,mean_tokens", output=False)
    assert res.exit_code == 0, res.output
    assert [ln.split() for ln in res.output.splitlines()] == [
        ["point", "scale", "mean_tokens"], ["-------", "-------", "-------------"],
        ["000", "1.00", "20.00"], ["001", "2.00", "40.00"],
    ]  # fmt: skip
    res = cli("show", str(sweep), "-c", "nope", output=False)
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert (
        "cpkv: error: --columns nope: not a column of this sweep's summary (columns: point, name,"
        in res.output
    )
    res = cli("show", str(sweep), "-c", "statsu", output=False)
    assert res.exit_code == 2 and "did you mean 'status'?" in res.output


def test_ls_tells_runs_of_one_config_apart(cli, tmp_path: Path) -> None:
    assert cli("admit").exit_code == 0
    assert cli("admit", "admit.cp.max_batch_requests=4", "admit.page_size=16").exit_code == 0
    entries = json.loads(cli("ls", str(cli.root), "-f", "json", output=False).output)
    assert [e["overrides"] for e in entries] == ["", "max_batch_requests=4 page_size=16"]
    text = cli("ls", str(cli.root), output=False).output
    assert "max_batch_requests=4 page_size=16" in text.splitlines()[3]
