"""``cpkv sweep``: many runs from configs x grids, into one sweep directory."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cpkv.cli.common import (
    ExecutorOpt,
    OutputDirOpt,
    RayAddressOpt,
    interrupted,
    is_path_arg,
    plot_or_warn,
    plots_option,
    user_errors,
    wants_plots,
)
from cpkv.core.errors import ConfigError
from cpkv.runs.rundir import DEFAULT_ROOT


@user_errors
def sweep(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="CONFIG... [KEY=VALUE | KEY=a,b,c]...",
            show_default=False,
            help="Config files (any kinds), then overrides; KEY=a,b,c sweeps KEY.",
        ),
    ] = None,
    output_dir: OutputDirOpt = DEFAULT_ROOT,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            help="Points run at once (local worker processes unless --executor says otherwise).",
        ),
    ] = None,
    executor: ExecutorOpt = None,
    ray_address: RayAddressOpt = None,
    allow_parallel_timing: Annotated[
        bool,
        typer.Option(
            "--allow-parallel-timing",
            help="Let timing benchmarks (allocator kinds) run at the same time as other points. Off by default: benchmarks sharing cores measure each other's contention, not the code.",
        ),
    ] = False,
    zips: Annotated[
        list[str] | None,
        typer.Option(
            "--zip",
            metavar="K1,K2",
            help="Move command-line sweeps of these keys in lock-step instead of a product (repeatable).",
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            metavar="SWEEP_DIR",
            help="Run the points of this sweep that have not completed (failed and skipped ones again).",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="List the points and check each (its input files, device and optional packages) without running anything; exit 1 when one would fail.",
        ),
    ] = False,
    name: Annotated[
        str | None, typer.Option("--name", help="Sweep name (default: the configs' names).")
    ] = None,
    plots: plots_option(
        "the sweep's own plots into SWEEP/plots/ when it ends (the headline metrics against "
        "each swept key; the points draw none, cpkv plot SWEEP --points does)"
    ) = None,
) -> None:
    """Run every config and every point of its grid into one sweep directory.

    \b
    Grids: a config's `sweep:` block maps dotted keys to lists of values (cartesian
    product; `zip:` holds keys whose lists move in lock-step); on the command line
    KEY=a,b,c sweeps KEY, KEY=range(1,4) sweeps 1,2,3, KEY=[a,b] is one list value.
      sweep:
        alloc_host.protocol: [cold, warm]
        zip: {alloc_host.page_size: [16, 64], alloc_host.repeat: [3, 5]}

    \b
    Each point is an ordinary run directory inside the sweep directory, beside
    sweep.yaml (the plan), summary.json / summary.txt (one table per kind: each
    point's swept values and headline metrics; then the points that did not complete
    and why) and, with --plots, plots/ (those metrics against each swept key). A
    failing point does not stop the others; a point that cannot run on this machine (a
    CUDA config without CUDA, a missing optional package) is skipped with its reason.
    Exit code: 0 when every point completed or was skipped, 1 when one failed, 2 for bad
    input (or a sweep directory another cpkv sweep holds); 130 / 143 / 129 when stopped
    by Ctrl-C / SIGTERM / SIGHUP (finish it with --resume).

    \b
    \b
    Examples:
      cpkv sweep configs/*.yaml        (the quick suite: every kind, under a minute)
      cpkv sweep configs/sweeps/host_small.yaml alloc_host.protocol=cold,warm --jobs 2
    """
    configs, overrides = _split(args)
    from cpkv.sweep.executors import check_address_option

    check_address_option(executor, ray_address)  # for --dry-run too
    if resume is not None:
        from cpkv.capacity.store import is_search_dir

        if is_search_dir(resume):
            raise ConfigError(
                f"{resume}: is a capacity search; continue it with `cpkv capacity --resume {resume}`"
            )
        if configs or overrides or zips or name:
            raise ConfigError(
                "--resume SWEEP_DIR takes no configs, overrides, --zip or --name (the sweep's plan is reused)"
            )
        if dry_run:
            _dry_run_resume(resume)
            return
    elif dry_run:
        _dry_run(configs, overrides, zips or (), name)
        return
    _run(
        configs,
        overrides,
        zips or (),
        name,
        output_dir,
        jobs,
        executor,
        ray_address,
        allow_parallel_timing,
        resume,
        wants_plots(plots),
    )


def _split(args: list[str] | None) -> tuple[list[str], list[str]]:
    configs, overrides = [], []
    for item in args or ():
        (overrides if "=" in item and not is_path_arg(item) else configs).append(item)
    return configs, overrides


def _dry_run(configs: list[str], overrides: list[str], zips: list[str], name: str | None) -> None:
    from cpkv.sweep import plan_sweep

    _print_points(plan_sweep(configs, overrides, zips=zips, name=name).points, set())


def _dry_run_resume(path: Path) -> None:
    from cpkv.sweep.store import point_status, read_plan

    plan, _ = read_plan(path)
    done = {p.index for p in plan.points if point_status(path / p.name) == "complete"}
    _print_points(plan.points, done)


def _print_points(points: Any, done: set[int]) -> None:
    """Check every point still to run (its prepare: files, devices, packages), print one line
    per point and the reason of each one that would fail or be skipped; exit 1 when one
    would fail."""
    from cpkv.runs.report import table
    from cpkv.sweep.check import FAIL, OK, SKIP, check_point

    checks = {p.index: check_point(p) for p in points if p.index not in done}
    rows = []
    for p in points:
        check = checks.get(p.index)
        rows.append({"point": p.name, "kind": p.kind, "config": p.source, "timed": p.timed,
                     "check": "done" if check is None else check.status})  # fmt: skip
    typer.echo(table(rows, ["point", "kind", "config", "timed", "check"]))
    problems = [c for c in checks.values() if c.status != OK]
    if problems:
        typer.echo("")
    for c in problems:
        what = "would be skipped" if c.status == SKIP else "would fail"
        typer.echo(f"{c.point.name}: {what}: {c.reason}")
    counts = {s: sum(c.status == s for c in checks.values()) for s in (OK, SKIP, FAIL)}
    typer.echo(
        f"\n{len(points)} points: {len(checks)} to run ({counts[OK]} ok, {counts[SKIP]} would be "
        f"skipped, {counts[FAIL]} would fail), {len(done)} done, "
        f"{sum(p.timed for p in points)} timed (dry run: nothing ran)"
    )
    if counts[FAIL]:
        raise typer.Exit(1)


def _run(
    configs,
    overrides,
    zips,
    name,
    output_dir,
    jobs,
    executor,
    address,
    allow_timing,
    resume,
    draw_plots,
) -> None:  # noqa: ANN001
    from cpkv.sweep import resume_sweep, run_sweep

    progress = Progress()
    common = {
        "executor": executor,
        "jobs": jobs,
        "address": address,
        "allow_parallel_timing": allow_timing,
        "argv": sys.argv,
        "on_start": progress.start,
        "on_result": progress.point,
        "plots": False,  # points draw no plots of their own: the sweep draws its own below
    }
    try:
        if resume is not None:
            result = resume_sweep(resume, **common)
        else:
            result = run_sweep(configs, overrides, zips=zips, name=name, root=output_dir, **common)
    except KeyboardInterrupt as err:
        progress.stop()
        then = ""
        if progress.sweep_dir is not None:
            then = f"; finish with: cpkv sweep --resume {progress.sweep_dir}"
        raise interrupted(err, then, run=False) from None
    finally:
        progress.stop()
    typer.echo(result.summary_text, nl=False)
    if draw_plots:  # the sweep's own plots, from the summary just written
        from cpkv.plots.sweep import plot_sweep
        from cpkv.plots.targets import sweep_title
        from cpkv.sweep.store import read_summary

        summary = read_summary(result.path)
        where = result.path / "plots"
        plot_or_warn(result.path, lambda: plot_sweep(summary, where, sweep_title(result.path)))
    typer.echo(str(result.path))
    skipped = [r for r in result.results.values() if r.status == "skipped"]
    if skipped:
        typer.echo(
            f"cpkv: {len(skipped)} of {len(result.plan.points)} points skipped: they cannot run on "
            "this machine (see summary.txt; --resume tries them again)",
            err=True,
        )
    if result.failed:
        typer.echo(
            f"cpkv: {len(result.failed)} of {len(result.plan.points)} points failed (see summary.txt)",
            err=True,
        )
        raise typer.Exit(1)


class Progress:
    """Counts and ETA on stderr: a rich progress bar on a terminal, one line per point otherwise."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.task: Any = None
        self.total = self.done = 0
        self.t0 = time.monotonic()
        self.sweep_dir: Path | None = None

    def start(self, sweep_dir: Path, total: int, skipped: int, notes: Any) -> None:
        self.total, self.t0, self.sweep_dir = total, time.monotonic(), sweep_dir
        for note in notes:
            typer.echo(f"cpkv: note: {note}", err=True)
        if skipped:
            typer.echo(
                f"cpkv: resuming: {skipped} point(s) already complete, {total} to run", err=True
            )
        if sys.stderr.isatty() and total:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.description}"),
                           console=Console(stderr=True))  # fmt: skip
            self.bar.start()
            self.task = self.bar.add_task("", total=total)

    def point(self, result: Any) -> None:
        self.done += 1
        mark = "ok" if result.status == "complete" else result.status.upper()
        line = f"[{self.done}/{self.total}] {mark} {result.name} ({result.seconds or 0:.1f}s){self._eta()}"
        if result.error:
            line += f": {result.error}"
        if self.bar is not None:
            if result.error:
                self.bar.console.print(line, markup=False, highlight=False)
            self.bar.update(self.task, advance=1, description=result.name[:40])
        else:
            typer.echo(line, err=True)

    def _eta(self) -> str:
        left = self.total - self.done
        if not left:
            return ""
        eta = (time.monotonic() - self.t0) / self.done * left
        return f", eta {int(eta // 60)}:{int(eta % 60):02d}"

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
