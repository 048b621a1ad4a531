"""Run a sweep (the programmatic twin of ``cpkv sweep``), or resume one.

Points of kinds that time things (allocator benchmarks) run one at a time, after the
others, unless ``allow_parallel_timing``: benchmarks sharing cores slow each other down
and their numbers would measure the contention, not the code.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from cpkv import __version__
from cpkv.core import signals
from cpkv.core.errors import CpkvError
from cpkv.core.files.writes import remove_stale_tmp_files
from cpkv.runs.rundir import (
    DEFAULT_ROOT,
    MARKER,
    STATUS_COMPLETE,
    STATUS_FAILED,
    STATUS_INCOMPLETE,
    iso,
    new_dir,
    remove_empty,
    utc_now,
)
from cpkv.sweep.executors import EXECUTORS, Phase, Task, check_executor
from cpkv.sweep.lock import SweepLock
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
    plots: bool | None = None


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
    plots: bool | None


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
    default ``sys.argv``); ``on_start`` and ``on_result`` callbacks; ``plots`` (False: no
    point draws plots; None: as :func:`cpkv.runs.runner.plots_wanted` says here, on the driver).

    The sweep directory is locked (:mod:`cpkv.sweep.lock`) while it runs; its ``sweep.yaml`` is
    written before anything else, and when that fails the directory is removed again.
    """
    plan = plan_sweep(configs, overrides, zips=zips, name=name)
    launch = _launch(**options)
    root = Path(root)
    new_dirs = [p for p in (root, *root.parents) if not p.exists()]
    sweep_dir = new_dir(root, f"sweep-{plan.name}")
    meta = {"created_utc": iso(utc_now()), "cpkv_version": __version__, "argv": list(launch.argv),
            "executor": launch.executor, "jobs": launch.jobs}  # fmt: skip
    results: dict[int, PointResult] = {}
    try:
        lock = SweepLock.acquire(sweep_dir, launch.argv)
    except BaseException:
        _remove_new(sweep_dir, new_dirs)
        raise
    with lock:
        try:
            write_plan(sweep_dir, plan, meta)
            mark_incomplete(sweep_dir)
            write_summary(sweep_dir, plan, {})
        except BaseException:  # a full disk, an interrupt: no half-made sweep directory
            _remove_new(sweep_dir, new_dirs)
            raise
        try:
            return _execute(sweep_dir, plan, results, launch)
        except CpkvError:
            if not results and not _any_point(sweep_dir, plan):
                _remove_new(sweep_dir, new_dirs)  # the executor could not start (no Ray cluster)
            raise


def _any_point(sweep_dir: Path, plan: SweepPlan) -> bool:
    return any((sweep_dir / p.name).exists() for p in plan.points)


def _remove_new(sweep_dir: Path, new_dirs: Sequence[Path]) -> None:
    """Remove ``sweep_dir``, then its day folder and ``new_dirs`` (deepest first) while empty."""
    shutil.rmtree(sweep_dir, ignore_errors=True)
    remove_empty([sweep_dir.parent, *new_dirs])


def resume_sweep(path: str | Path, **options: Unpack[LaunchOptions]) -> SweepResult:
    """Run the points of an existing sweep that have not completed (failed ones run again);
    ``options`` as for :func:`run_sweep`."""
    sweep_dir = Path(path)
    plan, _ = read_plan(sweep_dir)
    launch = _launch(**options)
    with SweepLock.acquire(sweep_dir, launch.argv):
        remove_stale_tmp_files(sweep_dir)  # those of a killed sweep (their process is gone)
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
    plots: bool | None = None,
) -> Launch:
    from cpkv.runs.runner import plots_wanted

    chosen = choose_executor(executor, jobs)
    check_executor(chosen, address)
    args = tuple(argv if argv is not None else sys.argv)
    if plots is None and not plots_wanted():
        plots = False  # CPKV_PLOTS=0 here: no point draws plots, wherever it runs
    return Launch(chosen, jobs, address, allow_parallel_timing, args, on_start, on_result, plots)


def choose_executor(executor: str | None, jobs: int | None) -> str:
    """The named executor, or ``process`` when ``jobs`` > 1, else ``serial``."""
    if executor is not None:
        return EXECUTORS.canonical(executor)
    return "process" if (jobs or 1) > 1 else "serial"


def _finished(sweep_dir: Path, plan: SweepPlan) -> dict[int, PointResult]:
    """Points already complete and readable (with their summary entries); other point
    directories (interrupted, failed, corrupt) are removed, to run again."""
    old = {pt.get("index"): pt for pt in read_summary(sweep_dir).get("points") or []
           if isinstance(pt, dict)}  # fmt: skip
    done = {}
    for point in plan.points:
        where = sweep_dir / point.name
        entry = old.get(point.index) or {}
        result = _from_disk(point.index, point.name, where, entry)
        if result is not None and result.status == STATUS_COMPLETE:
            done[point.index] = result
        elif where.exists():
            shutil.rmtree(where)  # an interrupted or failed attempt: it has no results to keep
    return done


def _from_disk(index: int, name: str, where: Path, entry: dict | None = None) -> PointResult | None:
    """What the point directory ``where`` says: complete (its results readable), failed (its
    meta.json's error), or None (absent, running, interrupted, corrupt)."""
    from cpkv.runs.headline import headline
    from cpkv.runs.rundir import load_run, read_meta

    status = point_status(where)
    if status == STATUS_FAILED:
        try:
            error = read_meta(where).get("error")
        except CpkvError:
            error = None
        return PointResult(index, name, STATUS_FAILED, str(error) if error else "failed")
    if status != STATUS_COMPLETE:
        return None
    try:
        shown = headline(load_run(where).record)
    except CpkvError:
        return None
    entry = entry or {}
    seconds = entry.get("seconds")
    return PointResult(index, name, STATUS_COMPLETE, None,
                       seconds if isinstance(seconds, int | float) else None, shown)  # fmt: skip


def reconcile(sweep_dir: Path, plan: SweepPlan, results: dict[int, PointResult]) -> None:
    """Add to ``results`` the points whose outcome is on disk but was never reported (a worker
    that finished a point as the sweep was stopped): the summary then matches the disk."""
    for point in plan.points:
        if point.index not in results:
            found = _from_disk(point.index, point.name, sweep_dir / point.name)
            if found is not None:
                results[point.index] = found


def settle_stopped(
    sweep_dir: Path, plan: SweepPlan, results: dict[int, PointResult], err: BaseException
) -> None:
    """After the executor stopped: a point it left between creating its directory and writing
    ``meta.json`` is removed (nothing in it; ``ls`` and ``--resume`` could not see it), and
    one whose ``meta.json`` still says ``running`` is marked incomplete with ``err``'s reason."""
    from cpkv.runs.rundir import RunDir, read_meta

    why = signals.reason(err) if isinstance(err, KeyboardInterrupt) else f"the sweep stopped: {err}"
    for point in plan.points:
        where = sweep_dir / point.name
        if point.index in results or not where.is_dir():
            continue
        if not (where / "meta.json").exists():
            shutil.rmtree(where, ignore_errors=True)
            continue
        with contextlib.suppress(CpkvError):
            meta = read_meta(where)
            if meta.get("status") == "running":
                RunDir(where, meta).fail(STATUS_INCOMPLETE, why)


def _execute(
    sweep_dir: Path, plan: SweepPlan, results: dict[int, PointResult], launch: Launch
) -> SweepResult:
    skipped = len(results)
    todo = [Task(p, sweep_dir / p.name, launch.argv, launch.plots)
            for p in plan.points if p.index not in results]  # fmt: skip
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
    try:
        EXECUTORS.get(launch.executor)([ph for ph in phases if ph.tasks], launch.address, record)
    except BaseException as err:  # Ctrl-C, SIGTERM, an executor that failed: the executor has
        settle_stopped(sweep_dir, plan, results, err)  # stopped its workers; the summary says
        reconcile(sweep_dir, plan, results)  # what the disk holds
        with contextlib.suppress(CpkvError):
            write_summary(sweep_dir, plan, results)
        raise
    reconcile(sweep_dir, plan, results)
    text = write_summary(sweep_dir, plan, results)
    if len(results) == len(plan.points):
        (sweep_dir / MARKER).unlink(missing_ok=True)
    return SweepResult(sweep_dir, plan, dict(results), text, skipped)
