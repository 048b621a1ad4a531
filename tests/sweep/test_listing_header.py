"""``cpkv ls`` reads a finished run's header (``meta.json``'s ``listed`` block) and parses none
of its files while they are those the run wrote; a run whose files changed is read in full,
and one that cannot be read back is listed as corrupt."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from cpkv.runs import listed, rundir
from cpkv.runs.headline import headline
from cpkv.sweep import listing
from cpkv.sweep.listing import list_entries
from tests.helpers.paths import REPO

GRID = str(REPO / "configs/admit_grid.yaml")


@pytest.fixture
def one_run(cli) -> Path:
    res = cli("admit", GRID)
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    return run


def _copy(run: Path, name: str) -> Path:
    """A second run directory, the same files under another name."""
    target = run.parent / f"{run.name}-{name}"
    shutil.copytree(run, target)
    return target


def _meta(run: Path) -> dict:
    return json.loads((run / "meta.json").read_text())


def _set_meta(run: Path, meta: dict) -> None:
    (run / "meta.json").write_text(json.dumps(meta))


def _entry(root: Path, run: Path) -> listing.Entry:
    (entry,) = [e for e in list_entries(root) if e.path == str(run)]
    return entry


def test_a_finished_run_holds_its_header(one_run: Path) -> None:
    block = _meta(one_run)[listed.KEY]
    results = (one_run / "results.json").read_bytes()
    assert block["files"]["results.json"] == listed.digest(results)
    assert block["files"]["config.yaml"] == listed.digest((one_run / "config.yaml").read_bytes())
    record = rundir.load_run(one_run).record
    assert block["headline"] == headline(record) and block["headline"]


def test_the_header_gives_the_line_reading_the_run_gives(cli, one_run: Path) -> None:
    old = _copy(one_run, "old")  # a run written before the header existed
    meta = _meta(old)
    del meta[listed.KEY]
    _set_meta(old, meta)
    fast, full = _entry(cli.root, one_run), _entry(cli.root, old)
    assert fast.status == full.status == "complete" and fast.headline
    assert replace(full, path=fast.path) == fast


def test_an_intact_run_is_listed_without_parsing_its_files(cli, one_run, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("parsed a file the header vouches for")

    monkeypatch.setattr(listing, "load_run", refuse)
    (entry,) = list_entries(cli.root)
    assert entry.status == "complete" and entry.headline.startswith("ticks=")


def test_a_changed_results_file_is_read_in_full(cli, one_run: Path) -> None:
    edited = _copy(one_run, "edited")
    results = edited / "results.json"
    doc = json.loads(results.read_text())
    first = next(iter(doc["summary"]["headline"]))
    doc["summary"]["headline"][first] = 12345
    results.write_text(json.dumps(doc))
    assert _entry(cli.root, edited).headline == f"{first}=1.234e+04"  # the file's, not the header's
    assert _entry(cli.root, one_run).headline != _entry(cli.root, edited).headline


CORRUPT = {
    "results-cut": ("results.json", lambda text: text[: len(text) // 2]),
    "results-same-size": ("results.json", lambda text: text.replace("{", "[", 1)),
    "results-future": ("results.json", lambda text: json.dumps({"schema_version": 99})),
    "config-invalid": ("config.yaml", lambda text: "a: [1\n"),
    "config-not-a-mapping": ("config.yaml", lambda text: "- 1\n"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_damaged_run_is_listed_as_corrupt(cli, one_run: Path, case: str) -> None:
    name, damage = CORRUPT[case]
    bad = _copy(one_run, case)
    (bad / name).write_text(damage((bad / name).read_text()))
    entry = _entry(cli.root, bad)
    assert entry.status == "corrupt" and name in entry.headline
    assert _entry(cli.root, one_run).status == "complete"  # the others still listed


def test_a_run_without_its_config_is_read_in_full(cli, one_run: Path) -> None:
    bare = _copy(one_run, "bare")
    (bare / "config.yaml").unlink()
    assert _entry(cli.root, bare).status == "complete"  # as a full read says
    assert rundir.load_run(bare).config == {}


def test_a_header_that_is_not_a_headline_is_not_shown(cli, one_run: Path) -> None:
    odd = _copy(one_run, "odd")
    meta = _meta(odd)
    meta[listed.KEY]["headline"] = {"ticks": "many"}
    _set_meta(odd, meta)
    assert _entry(cli.root, odd).headline == _entry(cli.root, one_run).headline  # read in full


def test_unreadable_meta_and_unfinished_runs(cli, one_run: Path) -> None:
    broken = _copy(one_run, "broken")
    (broken / "meta.json").write_text("{")
    running = _copy(one_run, "running")
    (running / rundir.MARKER).write_text("")
    failed = _copy(one_run, "failed")
    _set_meta(failed, {**_meta(failed), "status": "failed", "error": "boom"})
    assert _entry(cli.root, broken).status == "corrupt"
    assert _entry(cli.root, running).status == "incomplete"
    entry = _entry(cli.root, failed)
    assert entry.status == "failed" and entry.headline == "boom"


def test_runs_inside_a_sweep_are_points(cli, tmp_path: Path) -> None:
    res = cli("sweep", GRID, "admit.page_size=1,16")
    assert res.exit_code == 0, res.output
    res = cli("admit", GRID)
    assert res.exit_code == 0, res.output
    plain = list_entries(cli.root)
    assert sorted(e.type for e in plain) == ["run", "sweep"]
    every = list_entries(cli.root, points=True)
    assert sorted(e.type for e in every) == ["point", "point", "run", "sweep"]
    assert all(e.status == "complete" for e in every)
