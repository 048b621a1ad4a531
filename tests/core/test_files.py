"""Temporary files of cpkv.core.files.writes: which ones are stale (their writer is gone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cpkv.core.files.writes import process_exists, remove_stale_tmp_files, stale_tmp_files, tmp_path


def _ended_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_the_files_of_processes_that_are_gone_are_stale(tmp_path: Path) -> None:
    dead = _ended_pid()
    assert not process_exists(dead) and process_exists(os.getpid())
    assert not process_exists(0) and not process_exists(-1)
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    stale = [tmp_path / f".x.json.tmp-{dead}", nested / f".y.jsonl.tmp-{dead}"]
    kept = [
        tmp_path / tmp_path_name(tmp_path / "mine.json"),  # this process's
        tmp_path / f".x.json.tmp-{os.getppid()}",  # a process that runs
        tmp_path / f"x.json.tmp-{dead}",  # not a cpkv temporary name
        tmp_path / f".x.json.tmp-{dead}a",
    ]
    for p in (*stale, *kept):
        p.write_text("part")
    (tmp_path / f".folder.tmp-{dead}").mkdir()  # a folder is not a temporary file
    assert stale_tmp_files(tmp_path) == sorted(stale)
    assert remove_stale_tmp_files(tmp_path) == sorted(stale)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)
    assert stale_tmp_files(tmp_path / "missing") == []


def tmp_path_name(target: Path) -> str:
    return tmp_path(target).name
