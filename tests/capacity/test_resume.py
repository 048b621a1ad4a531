"""An interrupted capacity search resumes: complete points are reused (never run again),
unfinished ones run again, and the answer is the one an uninterrupted search gives."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from cpkv.capacity import resume_capacity, run_capacity
from cpkv.core.errors import InputError
from cpkv.sweep import executors
from cpkv.sweep.lock import SweepLock
from tests.helpers import closed_form as cf
from tests.hostile import faults as F

REAL_RUN_POINT = executors.run_point


def point_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and p.name[:3].isdigit())


def counting(monkeypatch: pytest.MonkeyPatch, stop_at: int | None = None) -> list[str]:
    """Count the points that run (their names); raise KeyboardInterrupt instead of running
    the ``stop_at``-th one (1-based), as Ctrl-C between two points would."""
    ran: list[str] = []
    real = REAL_RUN_POINT

    def run_point(task):  # noqa: ANN001, ANN202
        if stop_at is not None and len(ran) + 1 == stop_at:
            raise KeyboardInterrupt
        ran.append(task.point.name)
        return real(task)

    monkeypatch.setattr(executors, "run_point", run_point)
    return ran


def test_an_interrupted_search_resumes_without_rerunning_complete_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = str(cf.write_config(tmp_path / "case"))
    whole = run_capacity(config, root=tmp_path / "whole")
    counting(monkeypatch, stop_at=4)
    with pytest.raises(KeyboardInterrupt):
        run_capacity(config, root=tmp_path / "cut")
    (path,) = [p.parent for p in (tmp_path / "cut").rglob("capacity.yaml")]
    assert (path / "INCOMPLETE").exists()
    doc = json.loads((path / "capacity.json").read_text())
    assert doc["status"] == "incomplete" and len(doc["searches"][0]["points"]) == 3
    done = point_dirs(path)
    assert len(done) == 3  # the 4th point was planned (sweep.yaml) but never started
    before = {p.name: (p / "meta.json").read_text() for p in done}
    # a point killed while running: its directory exists without results
    (killed := path / "003_closed-form_speedup=0.59460").mkdir()
    (killed / "meta.json").write_text('{"status": "running"}')
    (killed / "INCOMPLETE").write_text("")

    ran = counting(monkeypatch)
    res = resume_capacity(path)
    assert res.reused == 3
    assert len(ran) == len(whole.results[0].points) - 3  # only the points not complete ran
    assert not set(ran) & set(before)
    for name, meta in before.items():  # reused as they were
        assert (path / name / "meta.json").read_text() == meta
    assert res.results[0].points == whole.results[0].points  # same loads, names, numbers
    assert res.results[0].capacity_load == whole.results[0].capacity_load
    assert not (path / "INCOMPLETE").exists() and res.status == "complete"


def test_a_held_search_directory_is_refused(tmp_path: Path) -> None:
    res = run_capacity(str(cf.write_config(tmp_path / "case")), root=tmp_path / "exp")
    with SweepLock.acquire(res.path, ["cpkv", "capacity", "x.yaml"]):
        with pytest.raises(InputError, match="another cpkv sweep is running in it"):
            resume_capacity(res.path)


def test_resuming_a_finished_search_runs_nothing(tmp_path: Path, monkeypatch) -> None:
    res = run_capacity(str(cf.write_config(tmp_path / "case")), root=tmp_path / "exp")
    ran = counting(monkeypatch)
    again = resume_capacity(res.path)
    assert ran == [] and again.reused == len(res.results[0].points)
    assert again.text == res.text


@pytest.mark.parametrize("jobs", [[], ["--jobs", "2"]], ids=["serial", "two-workers"])
def test_sigterm_stops_a_search_that_then_resumes(tmp_path: Path, jobs: list[str]) -> None:
    """A real process: SIGTERM while its second point runs -> exit 143 and the resume hint;
    --resume finishes it with the answer of an uninterrupted search. With worker processes
    (kept for the whole search) the workers stop too: no point is left running."""
    config = cf.write_config(tmp_path / "case", requests=2000)
    axis = ["admit.cost.fixed_us=20000,10000"] if jobs else []
    proc = F.start(["capacity", str(config), *axis, *jobs, "-o", "out"], tmp_path)
    second_round = "002_*" if jobs else "001_*"  # two workers run 000 and 001 together
    assert F.wait_for(
        lambda: len(list((tmp_path / "out").rglob(f"{second_round}/meta.json"))) == 1, 60
    )
    proc.send_signal(signal.SIGTERM)
    out = F.finish(proc)
    assert out.code == 143, out.stderr
    (path,) = [p.parent for p in (tmp_path / "out").rglob("capacity.yaml")]
    assert "cpkv: interrupted (SIGTERM); finish with: cpkv capacity --resume out/" in out.stderr
    assert (path / "INCOMPLETE").exists()
    complete = len(list(path.glob("*/results.json")))
    assert complete >= 1
    for point in point_dirs(path):  # every point ended: complete, or marked by its worker
        meta = json.loads((point / "meta.json").read_text())
        assert meta["status"] in ("complete", "incomplete"), (point.name, meta["status"])
    again = F.run(["capacity", "--resume", str(path)], tmp_path)
    assert again.code == 0, again.stderr
    assert f"resuming: {complete} point(s) already complete" in again.stderr
    whole = run_capacity(str(config), axis, root=tmp_path / "whole")
    doc = json.loads((path / "capacity.json").read_text())
    for search, expected in zip(doc["searches"], whole.results, strict=True):
        assert search["capacity_load"] == expected.capacity_load
        assert [p["load"] for p in search["points"]] == [p.load for p in expected.points]


def test_a_failed_point_ends_its_search_and_not_the_others(tmp_path: Path, monkeypatch) -> None:
    """A point that fails (here: every point of fixed_us=10000) ends that search as failed,
    with the point's error; the other search runs to its capacity; the command exits 1."""
    from cpkv.sweep.store import PointResult

    def run_point(task):  # noqa: ANN001, ANN202
        if task.point.config["admit"]["cost"]["fixed_us"] == 10000:
            return PointResult(task.point.index, task.point.name, "failed", "boom")
        return REAL_RUN_POINT(task)

    monkeypatch.setattr(executors, "run_point", run_point)
    config = str(cf.write_config(tmp_path / "case"))
    res = run_capacity(config, ["admit.cost.fixed_us=20000,10000"], root=tmp_path / "exp")
    ok, failed = res.results
    assert ok.outcome == "found" and failed.outcome == "failed"
    assert len(failed.points) == 1 and failed.error.endswith("failed: boom")
    assert res.status == "failed" and (res.path / "INCOMPLETE").exists() is False
    assert (
        "failed: fixed_us=10000: point 001_closed-form_fixed_us=10000.0_speedup=1.0 failed: boom"
        in res.text
    )
    assert json.loads((res.path / "capacity.json").read_text())["status"] == "failed"
