"""Run a sweep (the programmatic twin of ``cpkv sweep``), or resume one.

Points of kinds that time things (allocator benchmarks) run one at a time, after the
others, unless ``allow_parallel_timing``: benchmarks sharing cores slow each other down
and their numbers would measure the contention, not the code.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from cpkv import __version__
from cpkv.core.errors import CpkvError
from cpkv.runs.rundir import (
    DEFAULT_ROOT,
    MARKER,
    STATUS_COMPLETE,
    STATUS_FAILED,
    RunDir,
    iso,
    utc_now,
)
from cpkv.sweep.executors import EXECUTORS, Phase, Task, check_executor
from cpkv.sweep.plan import SweepPlan, plan_sweep
from cpkv.sweep.store import (
    PointResult,
    mark_incomplete,
    point_status,
    read_plan,
    read_summary,
    sweep_status,
    write_plan,
    write_summary,
)

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+
    from typing_extensions import Unpack

OnStart = Callable[[Path, int, int, Sequence[str]], None]
"""``on_start(sweep_dir, points_to_run, points_skipped, notes)``."""
OnResult = Callable[[PointResult], None]


@dataclass(frozen=True)
class SweepResult:
    """A finished (or interrupted) sweep: its directory, plan, and one result per point."""

    path: Path
    plan: SweepPlan
    results: dict[int, PointResult]
    summary_text: str
    skipped: int

    @property
    def failed(self) -> list[PointResult]:
        return [r for r in self.results.values() if r.status == STATUS_FAILED]

    @property
    def status(self) -> str:
        return sweep_status(
            [self.results[p.index] for p in self.plan.points if p.index in self.results]
        )


@dataclass(frozen=True)
class Launch:
    """How to run a sweep's points: executor, concurrency, cluster, and the callbacks."""

    executor: str
    jobs: int | None
    address: str | None
    allow_parallel_timing: bool
    argv: tuple[str, ...]
    on_start: OnStart | None = None
    on_result: OnResult | None = None


class LaunchOptions(TypedDict, total=False):
    """The keyword arguments of :func:`run_sweep` and :func:`resume_sweep` that say how the
    points run (defaults in :func:`_launch`)."""

    executor: str | None
    jobs: int | None
    address: str | None
    allow_parallel_timing: bool
    argv: Sequence[str] | None
    on_start: OnStart | None
    on_result: OnResult | None


def run_sweep(
    configs: Sequence[str],
    overrides: Sequence[str] = (),
    *,
    zips: Sequence[str] = (),
    name: str | None = None,
    root: str | Path = DEFAULT_ROOT,
    **options: Unpack[LaunchOptions],
) -> SweepResult:
    """Plan every point (all config errors surface here), create the sweep directory, run the points.

    ``options`` (:class:`LaunchOptions`): ``executor``, a key of :data:`cpkv.sweep.EXECUTORS`
    (default: ``process`` when ``jobs`` > 1, else ``serial``); ``jobs``; ``address``, the Ray
    cluster for ``executor="ray"``; ``allow_parallel_timing``; ``argv`` (recorded in the plan,
    default ``sys.argv``); ``on_start`` and ``on_result`` callbacks.
    """
    plan = plan_sweep(configs, overrides, zips=zips, name=name)
    launch = _launch(**options)
    root = Path(root)
    new_dirs = [p for p in (root, *root.parents) if not p.exists()]
    sweep_dir = RunDir.create(root, f"sweep-{plan.name}").path
    meta = {"created_utc": iso(utc_now()), "cpkv_version": __version__, "argv": list(launch.argv),
            "executor": launch.executor, "jobs": launch.jobs}  # fmt: skip
    write_plan(sweep_dir, plan, meta)
    mark_incomplete(sweep_dir)
    write_summary(sweep_dir, plan, {})
    results: dict[int, PointResult] = {}
    try:
        return _execute(sweep_dir, plan, results, launch)
    except CpkvError:
        if not results:  # the executor could not start (e.g. no Ray cluster): nothing to keep
            _remove_new(sweep_dir, new_dirs)
        raise


def _remove_new(sweep_dir: Path, new_dirs: Sequence[Path]) -> None:
    """Remove ``sweep_dir``, then its day folder and ``new_dirs`` (deepest first) while empty."""
    shutil.rmtree(sweep_dir, ignore_errors=True)
    for folder in (sweep_dir.parent, *new_dirs):
        try:
            folder.rmdir()
        except OSError:
            return


def resume_sweep(path: str | Path, **options: Unpack[LaunchOptions]) -> SweepResult:
    """Run the points of an existing sweep that have not completed (failed ones run again);
    ``options`` as for :func:`run_sweep`."""
    sweep_dir = Path(path)
    plan, _ = read_plan(sweep_dir)
    launch = _launch(**options)
    done = _finished(sweep_dir, plan)
    mark_incomplete(sweep_dir)
    return _execute(sweep_dir, plan, done, launch)


def _launch(
    executor: str | None = None,
    jobs: int | None = None,
    address: str | None = None,
    allow_parallel_timing: bool = False,
    argv: Sequence[str] | None = None,
    on_start: OnStart | None = None,
    on_result: OnResult | None = None,
) -> Launch:
    chosen = choose_executor(executor, jobs)
    check_executor(chosen, address)
    args = tuple(argv if argv is not None else sys.argv)
    return Launch(chosen, jobs, address, allow_parallel_timing, args, on_start, on_result)


def choose_executor(executor: str | None, jobs: int | None) -> str:
    """The named executor, or ``process`` when ``jobs`` > 1, else ``serial``."""
    if executor is not None:
        return EXECUTORS.canonical(executor)
    return "process" if (jobs or 1) > 1 else "serial"


def _finished(sweep_dir: Path, plan: SweepPlan) -> dict[int, PointResult]:
    """Points already complete (with their summary entries); other point directories are removed."""
    old = {pt.get("index"): pt for pt in read_summary(sweep_dir).get("points") or []}
    done = {}
    for point in plan.points:
        where = sweep_dir / point.name
        if point_status(where) == STATUS_COMPLETE:
            entry = old.get(point.index) or {}
            done[point.index] = PointResult(point.index, point.name, STATUS_COMPLETE, None,
                                            entry.get("seconds"), entry.get("headline") or _headline(where))  # fmt: skip
        elif where.exists():
            shutil.rmtree(where)  # an interrupted or failed attempt: it has no results to keep
    return done


def _headline(path: Path) -> dict[str, float]:
    from cpkv.runs.headline import headline
    from cpkv.runs.rundir import load_run

    return headline(load_run(path).record)


def _execute(
    sweep_dir: Path, plan: SweepPlan, results: dict[int, PointResult], launch: Launch
) -> SweepResult:
    skipped = len(results)
    todo = [Task(p, sweep_dir / p.name, launch.argv) for p in plan.points if p.index not in results]
    parallel = launch.executor != "serial" and (launch.jobs is None or launch.jobs > 1)
    together = [
        t for t in todo if launch.allow_parallel_timing or not parallel or not t.point.timed
    ]
    alone = [t for t in todo if t not in together]
    notes = []
    if alone:
        kinds = ", ".join(dict.fromkeys(t.point.kind for t in alone))
        notes.append(
            f"{len(alone)} timed point(s) ({kinds}) run one at a time: parallel timing on shared cores "
            "corrupts the numbers (--allow-parallel-timing to override)"
        )
    if launch.on_start is not None:
        launch.on_start(sweep_dir, len(todo), skipped, notes)

    def record(result: PointResult) -> None:
        results[result.index] = result
        write_summary(sweep_dir, plan, results)
        if launch.on_result is not None:
            launch.on_result(result)

    phases = [Phase(together, launch.jobs), Phase(alone, 1)]
    EXECUTORS.get(launch.executor)([ph for ph in phases if ph.tasks], launch.address, record)
    text = write_summary(sweep_dir, plan, results)
    if len(results) == len(plan.points):
        (sweep_dir / MARKER).unlink(missing_ok=True)
    return SweepResult(sweep_dir, plan, dict(results), text, skipped)
