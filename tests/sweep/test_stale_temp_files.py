"""``--resume`` removes the temporary files of a killed process (their PID runs no process),
and only those."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cpkv.capacity import resume_capacity, run_capacity
from cpkv.sweep import run_sweep
from tests.helpers import closed_form as cf
from tests.helpers.sweep_fake_kind import fake_kind  # noqa: F401  (fixture)


def gone_pid() -> int:
    """The PID of a process that has ended."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(proc.stdout)


def test_resume_sweeps_the_temp_files_of_a_killed_sweep(cli, tmp_path: Path, fake_kind) -> None:  # noqa: F811
    cfg = tmp_path / "e.yaml"
    cfg.write_text(yaml.safe_dump({"kind": "sweeptest", "name": "echo", "sweeptest": {"ticks": 2}}))
    seen = []

    def interrupt_after_one(result) -> None:
        seen.append(result.name)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep([str(cfg)], ["sweeptest.scale=1,2"], root=cli.root, on_result=interrupt_after_one)
    (sweep,) = [p.parent for p in cli.root.rglob("sweep.yaml")]
    (done,) = [p for p in sweep.iterdir() if (p / "results.json").is_file()]
    dead = gone_pid()
    stale = [sweep / f".summary.json.tmp-{dead}", done / f".results.txt.tmp-{dead}"]
    live = [sweep / f".notes.txt.tmp-{os.getppid()}", sweep / f".plan.txt.tmp-{os.getpid()}"]
    other = [sweep / f"summary.json.tmp-{dead}", sweep / ".summary.json.tmp-x"]  # not cpkv's names
    for p in (*stale, *live, *other):
        p.write_text("half a file")
    res = cli("sweep", "--resume", str(sweep), output=False)
    assert res.exit_code == 0, res.output
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in (*live, *other))
    assert (done / "results.json").is_file()  # the complete point stays as it was


def test_resume_sweeps_the_temp_files_of_a_killed_capacity_search(tmp_path: Path) -> None:
    res = run_capacity(str(cf.write_config(tmp_path / "case")), root=tmp_path / "exp")
    dead = gone_pid()
    stale = res.path / f".summary.json.tmp-{dead}"
    live = res.path / f".capacity.json.tmp-{os.getppid()}"
    for p in (stale, live):
        p.write_text("{")
    again = resume_capacity(res.path)
    assert again.text == res.text
    assert not stale.exists() and live.exists()
