"""Faults through the real ``cpkv`` process: a full disk at each write, stop signals on a run
and on a sweep, a second sweep process on the same directory.

A full disk is ``RLIMIT_FSIZE`` (``ulimit -f``) in the child: a write past it fails with
``File too large`` (cpkv ignores SIGXFSZ). The checks live in :mod:`tests.hostile.faults`
(each returns what went wrong); ``benchmarks/hostile_matrix.py`` repeats the signal cases at
many random moments, here each runs once at a seeded random moment.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest

from tests.hostile import faults as F

RNG = random.Random(17)


@pytest.mark.parametrize("case", F.FULL_DISK, ids=[c.name for c in F.FULL_DISK])
def test_a_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path: Path, case) -> None:
    assert F.check_full_disk(tmp_path, case) == []


def test_a_run_that_failed_on_a_full_disk_is_listed_failed(tmp_path: Path) -> None:
    (case,) = [c for c in F.FULL_DISK if c.name == "config.yaml"]
    assert F.check_full_disk(tmp_path, case) == []
    (run,) = F.run_dirs(tmp_path / "out")  # visible: meta.json is written first
    listing = F.run(["ls", "out"], tmp_path)
    assert listing.code == 0 and " failed " in listing.stdout and run.name in listing.stdout
    assert "config.yaml: cannot write (file too large)" in F.meta(run)["error"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL],
                         ids=["SIGTERM", "SIGHUP", "SIGINT", "SIGKILL"])  # fmt: skip
def test_a_stopped_run_says_why(tmp_path: Path, sig: int) -> None:
    assert F.check_run_signal(tmp_path, sig, RNG.uniform(0.05, 0.4)) == []


STARTUP_DELAYS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.35)
"""Seconds after the entry point started: importing the command line, parsing it, loading
the config, building the workload, the first iterations."""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("delay", STARTUP_DELAYS)
def test_a_stop_during_start_up_is_the_same_one_line(
    tmp_path: Path, sig: int, delay: float
) -> None:
    assert F.check_startup_signal(tmp_path, sig, delay) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_while_the_command_line_is_parsed_is_the_same_one_line(
    tmp_path: Path, sig: int
) -> None:
    assert F.check_parsing_signal(tmp_path, sig) == []


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    return F.reference_rows(tmp_path_factory.mktemp("reference"))


@pytest.mark.parametrize(
    ("jobs", "sig"),
    [(None, signal.SIGTERM), ("2", signal.SIGINT), ("2", signal.SIGKILL)],
    ids=["serial-SIGTERM", "jobs2-SIGINT", "jobs2-SIGKILL"],  # more in benchmarks/hostile_matrix.py
)
def test_a_stopped_sweep_resumes_to_the_same_rows(tmp_path: Path, reference, jobs, sig) -> None:
    extra = ["--jobs", jobs] if jobs else []
    assert F.check_sweep_signal(tmp_path, extra, sig, RNG.uniform(0.3, 0.8), reference) == []


def test_a_second_sweep_process_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    assert F.check_second_sweep(tmp_path) == []
