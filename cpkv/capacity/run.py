"""Run a capacity search (the programmatic twin of ``cpkv capacity``), or resume one.

Each value of the second axis has its own :class:`~cpkv.capacity.bracket.LoadSearch`. The
search goes in rounds: every unfinished search asks for its next load, the new points (at
most one per axis value) run together on the sweep executor (serial, local processes, Ray),
and their SLO attainment answers the searches. So one search's points run one after another
(each load depends on the previous answers), while different axis values run in parallel.
Points are ordinary run directories of a sweep directory (:mod:`cpkv.capacity.store`).

A resume replays the searches from the start: a point already complete on disk answers at
once (it never runs again), an interrupted or failed one is removed and runs again. The
results do not depend on the executor or on the order points finish: each search is a
function of its own points' results, and each point of its config and seed.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpkv import __version__
from cpkv.capacity.bracket import LoadSearch
from cpkv.capacity.load_range import load_range
from cpkv.capacity.plan import SearchPlan, plan_search
from cpkv.capacity.store import (
    PointOutcome,
    SearchResult,
    read_outcome,
    read_search,
    write_result,
    write_search,
)
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
from cpkv.sweep.executors import EXECUTORS, Phase, Task, executor_session
from cpkv.sweep.lock import SweepLock
from cpkv.sweep.plan import Point, SweepPlan
from cpkv.sweep.run import choose_executor, reconcile
from cpkv.sweep.store import (
    PointResult,
    mark_incomplete,
    read_plan,
    write_plan,
    write_summary,
)

OnPoint = Callable[[str, PointOutcome], None]
"""``on_point(axis label, outcome)`` after each point (run or reused)."""
OnStart = Callable[[Path, SearchPlan, int], None]
"""``on_start(search_dir, plan, points already complete)``."""
FAILED = "failed"


@dataclass(frozen=True)
class Launch:
    executor: str
    jobs: int | None
    address: str | None
    argv: tuple[str, ...]
    plots: bool | None
    on_start: OnStart | None
    on_point: OnPoint | None


@dataclass(frozen=True)
class CapacityResult:
    path: Path
    plan: SearchPlan
    results: tuple[SearchResult, ...]
    text: str
    reused: int

    @property
    def status(self) -> str:
        if any(r.outcome == FAILED for r in self.results):
            return STATUS_FAILED
        if any(r.outcome is None for r in self.results):
            return STATUS_INCOMPLETE
        return STATUS_COMPLETE


def run_capacity(
    config: str | None,
    overrides: Sequence[str] = (),
    *,
    flags: Mapping[str, Any] | None = None,
    name: str | None = None,
    root: str | Path = DEFAULT_ROOT,
    executor: str | None = None,
    jobs: int | None = None,
    address: str | None = None,
    argv: Sequence[str] | None = None,
    plots: bool | None = False,
    on_start: OnStart | None = None,
    on_point: OnPoint | None = None,
) -> CapacityResult:
    """Plan (every user error surfaces here), create the search directory, search.

    ``flags``: :class:`~cpkv.capacity.plan.CapacitySpec` fields that override the config's
    ``capacity:`` block (None values are ignored). ``plots``: whether each point draws its
    own plots (default False: ``cpkv plot SEARCH --points`` draws them later).
    """
    plan = plan_search(config, overrides, flags, name)
    launch = _launch(executor, jobs, address, argv, plots, on_start, on_point)
    _check_first_points(plan)
    root = Path(root)
    new_dirs = [p for p in (root, *root.parents) if not p.exists()]
    search_dir = new_dir(root, f"capacity-{plan.name}")
    meta = {"created_utc": iso(utc_now()), "cpkv_version": __version__, "argv": list(launch.argv),
            "executor": launch.executor, "jobs": launch.jobs}  # fmt: skip
    try:
        lock = SweepLock.acquire(search_dir, launch.argv)
    except BaseException:
        _remove_new(search_dir, new_dirs)
        raise
    with lock:
        try:
            write_search(search_dir, plan, meta)
            write_plan(search_dir, _sweep_plan(plan, []), meta)
            mark_incomplete(search_dir)
            write_summary(search_dir, _sweep_plan(plan, []), {})
        except BaseException:  # a full disk, an interrupt: no half-made search directory
            _remove_new(search_dir, new_dirs)
            raise
        try:
            return _search(search_dir, plan, [], {}, launch)
        except CpkvError:
            if not any(p.is_dir() for p in search_dir.iterdir()):
                _remove_new(search_dir, new_dirs)  # the executor could not start (no Ray)
            raise


def resume_capacity(
    path: str | Path,
    *,
    executor: str | None = None,
    jobs: int | None = None,
    address: str | None = None,
    argv: Sequence[str] | None = None,
    plots: bool | None = False,
    on_start: OnStart | None = None,
    on_point: OnPoint | None = None,
) -> CapacityResult:
    """Continue the search in ``path``: complete points are reused, the others run again."""
    search_dir = Path(path)
    plan = read_search(search_dir)
    sweep_plan, _ = read_plan(search_dir)
    launch = _launch(executor, jobs, address, argv, plots, on_start, on_point)
    with SweepLock.acquire(search_dir, launch.argv):
        remove_stale_tmp_files(search_dir)  # those of a killed search (their process is gone)
        found: dict[int, PointResult] = {}
        reconcile(search_dir, sweep_plan, found)  # what each point directory says
        done = {i: r for i, r in found.items() if r.status == STATUS_COMPLETE}
        for point in sweep_plan.points:
            where = search_dir / point.name
            if point.index not in done and where.exists():
                shutil.rmtree(where)  # interrupted or failed: it runs again if the search asks
        mark_incomplete(search_dir)
        return _search(search_dir, plan, list(sweep_plan.points), done, launch)


def _launch(
    executor: str | None,
    jobs: int | None,
    address: str | None,
    argv: Sequence[str] | None,
    plots: bool | None,
    on_start: OnStart | None,
    on_point: OnPoint | None,
) -> Launch:
    from cpkv.sweep.executors import check_executor

    chosen = choose_executor(executor, jobs)
    check_executor(chosen, address)
    args = tuple(argv if argv is not None else sys.argv)
    return Launch(chosen, jobs, address, args, plots, on_start, on_point)


def _check_first_points(plan: SearchPlan) -> None:
    """Each axis value's first point prepares (reads its files) before anything is written."""
    from cpkv.sweep.check import FAIL, check_point

    for i in range(len(plan.values)):
        check = check_point(plan.point(0, i, plan.start))
        if check.status == FAIL:
            label = f"{plan.axis_key}={plan.values[i].label}: " if plan.axis_key else ""
            raise CpkvError(f"{label}{check.reason}")


def _remove_new(search_dir: Path, new_dirs: Sequence[Path]) -> None:
    shutil.rmtree(search_dir, ignore_errors=True)
    remove_empty([search_dir.parent, *new_dirs])


def _sweep_plan(plan: SearchPlan, points: Sequence[Point]) -> SweepPlan:
    keys = (plan.axis_key, plan.load_key) if plan.axis_key else (plan.load_key,)
    configs = (plan.config_path,) if plan.config_path else ()
    return SweepPlan(f"capacity-{plan.name}", configs, plan.overrides, (), tuple(points), keys)


class _Search:
    """The searches of one directory and the points they have asked for."""

    def __init__(
        self, path: Path, plan: SearchPlan, points: list[Point], done: dict[int, PointResult]
    ) -> None:
        self.path, self.plan, self.points, self.results = path, plan, points, done
        spec = plan.spec
        self.searches = []
        for av in plan.values:
            floor, ceiling = load_range(plan.load_key, av.config)
            self.searches.append(
                LoadSearch(
                    plan.start,
                    spec.tolerance,
                    spec.growth,
                    spec.max_points,
                    floor=floor,
                    ceiling=ceiling,
                )  # fmt: skip
            )
        self.tried: list[list[PointOutcome]] = [[] for _ in plan.values]
        self.errors: dict[int, str] = {}
        self.by_key = {}
        for point in points:
            i = plan.value_index(point)
            if i is not None:
                self.by_key[(i, float(point.swept[plan.load_key]))] = point
        self.reused = 0
        self.target_pct = 100.0 * spec.attainment

    def next_batch(self, on_point: OnPoint | None) -> list[tuple[int, Point]]:
        """One new point per unfinished search; complete points on disk answer on the way."""
        batch, grew = [], False
        for i, search in enumerate(self.searches):
            while i not in self.errors and (load := search.next_load()) is not None:
                point = self.by_key.get((i, load))
                if point is not None and point.index in self.results:
                    self._answer(i, point, on_point, reused=True)
                    continue
                if point is None:
                    point = self.plan.point(len(self.points), i, load)
                    self.points.append(point)
                    self.by_key[(i, load)] = point
                    grew = True
                batch.append((i, point))
                break
        if grew:
            write_plan(self.path, _sweep_plan(self.plan, self.points), {})
        return batch

    def _answer(self, i: int, point: Point, on_point: OnPoint | None, reused: bool = False) -> None:
        load = float(point.swept[self.plan.load_key])
        result = self.results.get(point.index)
        if result is None or result.status != STATUS_COMPLETE:
            error = (result.error if result is not None else None) or "did not run"
            outcome = PointOutcome(load, point.name, result.status if result else "incomplete",
                                   error=error)  # fmt: skip
            self.errors[i] = f"point {point.name} {outcome.status}: {error}"
        else:
            try:
                outcome = read_outcome(self.path / point.name, load, self.target_pct)
            except CpkvError as err:
                outcome = PointOutcome(load, point.name, STATUS_FAILED, error=str(err))
                self.errors[i] = f"point {point.name}: {err}"
            else:
                self.searches[i].record(load, bool(outcome.met))
        self.tried[i].append(outcome)
        self.reused += reused
        if on_point is not None:
            on_point(self.plan.values[i].label, outcome)

    def outcomes(self) -> list[SearchResult]:
        out = []
        for i, (av, search) in enumerate(zip(self.plan.values, self.searches, strict=True)):
            outcome = FAILED if i in self.errors else search.outcome
            out.append(
                SearchResult(av.label, av.value, outcome, search.low if outcome else None,
                             (search.low, search.high), tuple(self.tried[i]), self.errors.get(i))
            )  # fmt: skip
        return out

    def write(self) -> str:
        results = self.outcomes()
        status = (
            STATUS_FAILED if any(r.outcome == FAILED for r in results)
            else STATUS_INCOMPLETE if any(r.outcome is None for r in results)
            else STATUS_COMPLETE
        )  # fmt: skip
        sweep_plan = _sweep_plan(self.plan, self.points)
        write_summary(self.path, sweep_plan, self.results)
        return write_result(self.path, self.plan, results, status)


def _search(
    path: Path,
    plan: SearchPlan,
    points: list[Point],
    done: dict[int, PointResult],
    launch: Launch,
) -> CapacityResult:
    state = _Search(path, plan, points, done)
    if launch.on_start is not None:
        launch.on_start(path, plan, len(done))
    run = EXECUTORS.get(launch.executor)
    try:
        with executor_session(launch.executor, launch.address, launch.jobs):
            while batch := state.next_batch(launch.on_point):
                tasks = [Task(p, path / p.name, launch.argv, launch.plots) for _, p in batch]

                def record(result: PointResult) -> None:
                    state.results[result.index] = result
                    write_summary(path, _sweep_plan(plan, state.points), state.results)

                run([Phase(tasks, launch.jobs)], launch.address, record)
                for i, point in batch:
                    state._answer(i, point, launch.on_point)
                state.write()
    except BaseException:  # Ctrl-C, SIGTERM, an executor that failed: what the disk holds
        sweep_plan = _sweep_plan(plan, state.points)
        reconcile(path, sweep_plan, state.results)
        with contextlib.suppress(CpkvError):
            state.write()
        raise
    text = state.write()
    results = tuple(state.outcomes())
    if all(r.outcome is not None for r in results):
        (path / MARKER).unlink(missing_ok=True)
    return CapacityResult(path, plan, results, text, state.reused)
