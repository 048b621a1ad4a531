"""Faults through the real ``cpkv`` process: a full disk at each write, stop signals on a run
and on a sweep, a second sweep process on the same directory.

A full disk is ``RLIMIT_FSIZE`` (``ulimit -f``) in the child: a write past it fails with
``File too large`` (cpkv ignores SIGXFSZ). ``benchmarks/hostile_matrix.py`` repeats the
signal cases at many random moments; here each runs once, at a seeded random moment.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest

from tests.hostile import faults as F

RNG = random.Random(17)


def one_error(outcome: F.Outcome) -> str:
    line = F.one_line(outcome.stderr)
    assert line is not None, outcome.stderr
    return line


# -- a full disk ------------------------------------------------------------------------------


def test_full_disk_at_config_yaml_marks_the_run_failed(tmp_path: Path) -> None:
    # meta.json (about 600 bytes) fits under 1200, config.yaml (about 1.8 kB) does not
    out = F.run(["admit", "-o", "out"], tmp_path, file_limit=1200)
    line = one_error(out)
    assert (
        out.code == 2
        and line.startswith("cpkv: error: ")
        and "config.yaml: cannot write (file too large)" in line
    )
    (run,) = F.run_dirs(tmp_path / "out")  # the run is visible: meta.json was written first
    meta = F.meta(run)
    assert (
        meta["status"] == "failed"
        and "config.yaml" in meta["error"]
        and "file too large" in meta["error"]
    )
    assert (run / "INCOMPLETE").exists() and not (run / "results.json").exists()
    assert F.temp_files(tmp_path) == []
    listing = F.run(["ls", "out"], tmp_path)
    assert listing.code == 0 and "failed" in listing.stdout and run.name in listing.stdout


def test_full_disk_at_results_json_marks_the_run_failed(tmp_path: Path) -> None:
    args = ["alloc", "host", "alloc_host.host_sizes_gb=[]", "alloc_host.host_pages=[600]",
            "alloc_host.request_pages=[8]", "alloc_host.repeat=2", "alloc_host.warmup=0", "-o", "out"]  # fmt: skip
    out = F.run(args, tmp_path, file_limit=4096)  # results.txt is about 2 kB, results.json 8 kB
    line = one_error(out)
    assert out.code == 2 and "results.json: cannot write (file too large)" in line, line
    (run,) = F.run_dirs(tmp_path / "out")
    assert F.meta(run)["status"] == "failed" and "results.json" in F.meta(run)["error"]
    assert not (run / "results.json").exists() and (run / "results.txt").exists()
    assert F.temp_files(tmp_path) == []


def test_full_disk_at_sweep_yaml_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(F.SWEEP_CONFIG)
    out = F.run(["sweep", "s.yaml", "-o", "out"], tmp_path, file_limit=2000)  # the plan: ~8 kB
    line = one_error(out)
    assert out.code == 2 and "sweep.yaml: cannot write (file too large)" in line, line
    assert not (tmp_path / "out").exists() and F.temp_files(tmp_path) == []


def test_full_disk_at_write_workload_leaves_nothing(tmp_path: Path) -> None:
    args = ["admit", "--write-workload", "w.jsonl", "admit.workload.source=synthetic"]
    out = F.run(args, tmp_path, file_limit=4096)  # 1000 requests: about 60 kB
    line = one_error(out)
    assert out.code == 2 and "w.jsonl: cannot write (file too large)" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- stop signals on a run ----------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_marks_the_run_incomplete_with_the_reason(tmp_path: Path, sig: int) -> None:
    proc = F.start([*F.LONG_RUN, "-o", "out"], tmp_path)
    assert F.wait_for(lambda: F.run_dirs(tmp_path / "out")), "the run never started"
    time.sleep(RNG.uniform(0.05, 0.4))
    proc.send_signal(sig)
    out = F.finish(proc, timeout=20)
    name = signal.Signals(sig).name
    (run,) = F.run_dirs(tmp_path / "out")
    assert out.code == 128 + sig, (out.code, out.stderr)  # 143, 129, 130
    assert (
        F.one_line(out.stderr)
        == f"cpkv: interrupted ({name}); {run.relative_to(tmp_path)} is marked incomplete"
    )
    meta = F.meta(run)
    assert (
        meta["status"] == "incomplete"
        and meta["error"] == f"interrupted ({name})"
        and meta["end_utc"]
    )
    assert (run / "INCOMPLETE").exists() and not (run / "results.json").exists()
    assert F.temp_files(tmp_path) == []


def test_a_killed_run_is_listed_incomplete(tmp_path: Path) -> None:
    proc = F.start([*F.LONG_RUN, "-o", "out"], tmp_path)
    assert F.wait_for(lambda: F.run_dirs(tmp_path / "out"))
    time.sleep(0.2)
    proc.kill()
    F.finish(proc)
    listing = F.run(["ls", "out"], tmp_path)
    assert listing.code == 0 and " incomplete " in listing.stdout, listing.stdout


# -- stop signals on a sweep --------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Every point's rows (timings aside) from an uninterrupted serial sweep."""
    folder = tmp_path_factory.mktemp("reference")
    (folder / "s.yaml").write_text(F.SWEEP_CONFIG)
    out = F.run(["sweep", "s.yaml", "-o", "out"], folder)
    assert out.code == 0, out.stderr
    sweep = F.sweep_of(folder / "out")
    assert sweep is not None
    return {p.name: F.rows_without_timing(p) for p in F.point_dirs(sweep)}


def interrupt_then_resume(folder: Path, extra: list[str], sig: int, delay: float,
                          reference: dict[str, list[dict]]) -> None:  # fmt: skip
    """Stop a sweep with ``sig`` after ``delay`` s, check the directory, resume, compare."""
    (folder / "s.yaml").write_text(F.SWEEP_CONFIG)
    proc = F.start(["sweep", "s.yaml", "-o", "out", *extra], folder)
    assert F.wait_for(lambda: F.sweep_of(folder / "out") is not None, 30)
    time.sleep(delay)
    proc.send_signal(sig)
    out = F.finish(proc, timeout=30)
    sweep = F.sweep_of(folder / "out")
    assert sweep is not None
    if out.code == 0:  # the sweep finished before the signal landed: nothing to resume
        assert all(F.complete(p) for p in F.point_dirs(sweep))
        return
    assert out.code == F.stop_signal_code(sig), (out.code, out.stderr)
    if sig != signal.SIGKILL:
        name = signal.Signals(sig).name
        lines = out.stderr.strip().splitlines()  # progress lines ("[2/6] ok ..."), then one line
        assert "Traceback" not in out.stderr and lines, out.stderr
        assert lines[-1].startswith(
            f"cpkv: interrupted ({name}); finish with: cpkv sweep --resume"
        ), out.stderr
        assert all(line.startswith(("[", "cpkv: note:")) for line in lines[:-1]), out.stderr
        assert F.summary_matches_disk(sweep) == []  # no worker wrote after the summary
        for point in F.point_dirs(sweep):  # every point directory says what happened to it
            assert F.complete(point) or F.meta(point)["status"] in ("incomplete", "failed"), point
    assert F.temp_files(folder) == []
    listing = F.run(["ls", "out", "--points"], folder)
    assert listing.code == 0 and "sweep" in listing.stdout and "Traceback" not in listing.stderr
    before = {p.name: F.meta(p)["start_utc"] for p in F.point_dirs(sweep) if F.complete(p)}
    resumed = F.run(["sweep", "--resume", str(sweep.relative_to(folder))], folder)
    assert resumed.code == 0, resumed.stderr
    points = F.point_dirs(sweep)
    assert [p.name for p in points] == sorted(reference)  # no point lost, none added
    for point in points:
        assert F.rows_without_timing(point) == reference[point.name], point.name
        if point.name in before:  # a finished point is not run twice
            assert F.meta(point)["start_utc"] == before[point.name], point.name
    doc = json.loads((sweep / "summary.json").read_text())
    assert doc["status"] == "complete" and not (sweep / "INCOMPLETE").exists()
    assert F.temp_files(folder) == []


@pytest.mark.parametrize(
    ("jobs", "sig"),
    [(None, signal.SIGTERM), (None, signal.SIGKILL), ("2", signal.SIGINT), ("2", signal.SIGKILL)],
    ids=["serial-SIGTERM", "serial-SIGKILL", "jobs2-SIGINT", "jobs2-SIGKILL"],
)
def test_a_stopped_sweep_resumes_to_the_same_rows(tmp_path: Path, reference, jobs, sig) -> None:
    extra = ["--jobs", jobs] if jobs else []
    interrupt_then_resume(tmp_path, extra, sig, RNG.uniform(0.3, 0.8), reference)


def test_a_second_sweep_process_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(F.SWEEP_CONFIG.replace("count: 6000", "count: 40000"))
    first = F.start(["sweep", "s.yaml", "-o", "out"], tmp_path)
    assert F.wait_for(lambda: F.sweep_of(tmp_path / "out") is not None)
    sweep = F.sweep_of(tmp_path / "out")
    assert sweep is not None
    second = F.run(["sweep", "--resume", str(sweep)], tmp_path)
    line = one_error(second)
    assert (
        second.code == 2
        and f"{sweep}: another cpkv sweep is running in it (pid {first.pid}" in line
    ), line
    assert F.finish(first).code == 0  # the first one was not disturbed
    assert json.loads((sweep / "summary.json").read_text())["status"] == "complete"
