"""``cpkv capacity``: the highest load at which a serving config meets its SLO."""

from __future__ import annotations

import sys
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
def capacity(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="CONFIG [KEY=VALUE | KEY=a,b,c]...",
            show_default=False,
            help="A serving config (kind admit, admit.mode serving, admit.slo set), then overrides; one KEY=a,b,c is the second axis.",
        ),
    ] = None,
    attainment: Annotated[
        float | None,
        typer.Option(
            "--attainment",
            metavar="FRACTION",
            help="Target: this fraction of all requests within admit.slo (default 0.9, or the config's capacity.attainment).",
        ),
    ] = None,
    tolerance: Annotated[
        float | None,
        typer.Option(
            "--tolerance",
            metavar="REL",
            help="Stop when the bracket is this narrow, relative (default 0.02: the capacity to 2%).",
        ),
    ] = None,
    start: Annotated[
        float | None,
        typer.Option(
            "--start",
            metavar="LOAD",
            help="First load (default: the config's admit.arrivals.rate_rps or speedup).",
        ),
    ] = None,
    growth: Annotated[
        float | None,
        typer.Option(
            "--growth", metavar="X", help="Factor between loads while bracketing (default 2)."
        ),
    ] = None,
    max_requests: Annotated[
        int | None,
        typer.Option(
            "--max-requests",
            metavar="N",
            help="Serve at most N requests per point (a trace's first N: admit.workload.limit) to keep a search cheap.",
        ),
    ] = None,
    max_points: Annotated[
        int | None,
        typer.Option("--max-points", metavar="N", help="At most N points per search (default 30)."),
    ] = None,
    output_dir: OutputDirOpt = DEFAULT_ROOT,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            help="Points run at once: the searches of different second-axis values run in parallel.",
        ),
    ] = None,
    executor: ExecutorOpt = None,
    ray_address: RayAddressOpt = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            metavar="SEARCH_DIR",
            help="Continue an interrupted search: complete points are reused, never run again.",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Search name (default: the config's name).")
    ] = None,
    plots: plots_option("plots/capacity.png when the search ends") = None,
) -> None:
    """Find the highest load at which the SLO holds for a target share of requests.

    \b
    The load is admit.arrivals.rate_rps (Poisson arrivals) or admit.arrivals.speedup (a
    trace's own times, compressed). From the first load, the search multiplies by --growth
    while the target holds (divides while it fails) until it has a load that meets the
    target and one that misses it; then it bisects (geometric midpoint) until the two are
    within --tolerance. The answer is the highest load that met the target. Attainment is
    the serving summary's slo_attainment_pct: requests within admit.slo / all requests.

    \b
    A second axis (a config's sweep: block with one key, or KEY=a,b,c here) gives one
    search per value and a table of capacities; those searches run in parallel on the
    sweep executors (--jobs, --executor ray), each one's points in sequence. Settings may
    also come from the config's capacity: block (attainment, tolerance, growth, start,
    max_requests, max_points) or capacity.KEY=VALUE overrides; flags win.

    \b
    The search directory is a sweep directory (cpkv ls, show, diff and plot read it):
    one ordinary run directory per point, capacity.json / capacity.txt (the points tried
    and the capacities) and, with --plots, plots/capacity.png (attainment and goodput
    against the offered load, capacities marked). Points draw no plots of their own
    (cpkv plot SEARCH --points draws them). Exit code: 0 when every search ended, 1 when
    a point failed, 2 for bad input; 130 / 143 / 129 when stopped (finish with --resume).

    \b
    Examples:
      cpkv capacity configs/capacity/mooncake.yaml
      cpkv capacity configs/admit/serving_mooncake.yaml admit.policy=prefill_adder,conservative --jobs 2
    """
    configs, overrides = [], []
    for item in args or ():
        (overrides if "=" in item and not is_path_arg(item) else configs).append(item)
    from cpkv.sweep.executors import check_address_option

    check_address_option(executor, ray_address)
    flags = {"attainment": attainment, "tolerance": tolerance, "start": start, "growth": growth,
             "max_requests": max_requests, "max_points": max_points}  # fmt: skip
    if resume is not None:
        if configs or overrides or name or any(v is not None for v in flags.values()):
            raise ConfigError(
                "--resume SEARCH_DIR takes no config, overrides, settings or --name (the "
                "search's plan is reused)"
            )
    elif len(configs) != 1:
        raise ConfigError(
            "cpkv capacity: name one config file (kind admit, admit.mode serving, admit.slo set)"
            + (f"; got {', '.join(configs)}" if configs else "")
        )
    draw_plots = wants_plots(plots)
    _run(
        configs, overrides, flags, name, output_dir, jobs, executor, ray_address, resume, draw_plots
    )


def _run(
    configs, overrides, flags, name, output_dir, jobs, executor, address, resume, draw_plots
) -> None:  # noqa: ANN001
    from cpkv.capacity import resume_capacity, run_capacity

    where: list[Path] = []

    def started(path: Path, plan: Any, reused: int) -> None:
        where.append(path)
        axis = f", second axis {plan.axis_key} ({len(plan.values)} values)" if plan.axis_key else ""
        typer.echo(
            f"cpkv: capacity search of {plan.load_key}{axis}: target {100 * plan.spec.attainment:g}% "
            f"of requests within the SLO, tolerance {100 * plan.spec.tolerance:g}%", err=True,
        )  # fmt: skip
        if reused:
            typer.echo(f"cpkv: resuming: {reused} point(s) already complete", err=True)

    def point(label: str, outcome: Any) -> None:
        axis = "" if label == "-" else f"{label} "
        if outcome.attainment_pct is None:
            typer.echo(
                f"  {axis}load {outcome.load:g}: {outcome.status}: {outcome.error}", err=True
            )
            return
        verdict = "meets" if outcome.met else "misses"
        rate = outcome.offered_requests_per_s
        offered = f" ({rate:.3g} req/s)" if rate is not None else ""
        typer.echo(
            f"  {axis}load {outcome.load:g}{offered}: attainment {outcome.attainment_pct:.1f}% {verdict}",
            err=True,
        )

    common = {"executor": executor, "jobs": jobs, "address": address, "argv": sys.argv,
              "on_start": started, "on_point": point}  # fmt: skip
    try:
        if resume is not None:
            result = resume_capacity(resume, **common)
        else:
            result = run_capacity(configs[0], overrides, flags=flags, name=name,
                                  root=output_dir, **common)  # fmt: skip
    except KeyboardInterrupt as err:
        then = f"; finish with: cpkv capacity --resume {where[0]}" if where else ""
        raise interrupted(err, then, run=False) from None
    typer.echo(result.text, nl=False)
    if draw_plots:
        _plot(result.path)
    typer.echo(str(result.path))
    if result.status == "failed":
        typer.echo("cpkv: a search stopped on a failed point (see capacity.txt)", err=True)
        raise typer.Exit(1)


def _plot(path: Path) -> None:
    from cpkv.capacity.store import read_result
    from cpkv.plots.capacity import plot_capacity, plot_frontier

    doc = read_result(path)
    if doc is not None:
        plot_or_warn(path, lambda: plot_capacity(doc, path / "plots"))
        if doc.get("frontier"):
            plot_or_warn(path, lambda: plot_frontier(doc, path / "plots"))
