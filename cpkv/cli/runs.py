"""``cpkv diff``, ``cpkv show``, ``cpkv ls``, ``cpkv plot``: working with saved runs and sweeps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cpkv.cli.common import fail, user_errors
from cpkv.core.errors import ConfigError
from cpkv.runs.rundir import DEFAULT_ROOT

TargetArg = Annotated[
    Path,
    typer.Argument(
        metavar="RUN_OR_SWEEP", help="A run directory or a sweep directory.", show_default=False
    ),
]


def _format(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"--format {value}: unknown format (allowed: {', '.join(allowed)})")
    return value


@user_errors
def diff(
    a: Annotated[
        Path,
        typer.Argument(metavar="A", help="Baseline run or sweep directory.", show_default=False),
    ],
    b: Annotated[
        Path,
        typer.Argument(
            metavar="B", help="Run or sweep directory to compare with A.", show_default=False
        ),
    ],
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold",
            "-t",
            metavar="METRIC:PCT",
            help="Change (%) a metric must exceed to count; METRIC may be a name, 'timing', 'other' or '*' (repeatable; default timing:10, other:0).",
        ),
    ] = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            "-m",
            metavar="METRIC",
            help="Compare only these metrics (repeatable; default: the metrics of the kind's table).",
        ),
    ] = None,
    ignore: Annotated[
        list[str] | None,
        typer.Option(
            "--ignore",
            metavar="COLUMN",
            help="Do not match rows on this identity column (repeatable), to compare runs that differ in it.",
        ),
    ] = None,
    only_changed: Annotated[
        bool,
        typer.Option(
            "--only-changed", help="Show only metrics that got significantly worse or better."
        ),
    ] = False,
    fmt: Annotated[
        str, typer.Option("--format", "-f", metavar="FORMAT", help="text, markdown or json.")
    ] = "text",
) -> None:
    """Compare two runs (or two sweeps): config differences, then every metric of every matched row.

    \b
    Rows are matched on their identity columns; each metric gets A, B, ratio B/A,
    change and a verdict: same (within threshold), noise (a timing metric beyond its
    threshold whose spreads overlap: p05..p95, else value +- stdev, else min..max),
    worse or better. Sweeps are matched point by point (kind, config, swept values).
    Exit code: 0 no regression, 1 a metric got worse (a CI gate), 2 unusable input
    (not a run, unsupported schema version, different kinds, no rows matched).

    Example: cpkv diff experiments/2026-05-01/10-00-00-000000_host experiments/2026-05-02/09-00-00-000000_host -t p99_us:20
    """
    from cpkv.diff.compare import Thresholds, diff_paths
    from cpkv.diff.render import DIFF_FORMATS, render_diff

    _format(fmt, DIFF_FORMATS)
    result = diff_paths(
        str(a), str(b), Thresholds.parse(threshold or []), metric or [], ignore or []
    )
    typer.echo(render_diff(result, fmt, only_changed), nl=False)
    if result.regressions:
        raise typer.Exit(1)
    if not result.matched:
        raise fail("no rows matched, nothing was compared (see the notes above)")


@user_errors
def show(
    target: TargetArg,
    fmt: Annotated[
        str, typer.Option("--format", "-f", metavar="FORMAT", help="text, markdown, json or csv.")
    ] = "text",
    columns: Annotated[
        str | None,
        typer.Option(
            "--columns",
            "-c",
            metavar="A,B,...",
            help="Table columns (default: the kind's table columns).",
        ),
    ] = None,
) -> None:
    """Re-render a run's table from its results.json (a sweep's: its summary).

    Example: cpkv show experiments/2026-05-01/10-00-00-000000_host --format markdown
    """
    from cpkv.runs.report import FORMATS, render
    from cpkv.sweep.listing import SweepView, open_target
    from cpkv.sweep.store import summary_table

    _format(fmt, FORMATS)
    loaded = open_target(target)
    if isinstance(loaded, SweepView):
        if not loaded.summary:
            raise ConfigError(
                f"{target}: the sweep has no readable summary.json (missing or corrupt; "
                f"`cpkv sweep --resume {target}` writes it again)"
            )
        import json

        typer.echo(
            json.dumps(loaded.summary, indent=1)
            if fmt == "json"
            else summary_table(loaded.summary, fmt),
            nl=fmt == "json",
        )
        return
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
    known = list(loaded.record.rows[0]) if loaded.record.rows else []
    bad = [c for c in cols or [] if c not in known]
    if bad:
        raise ConfigError(
            f"--columns {bad[0]}: not a column of this run (columns: {', '.join(known)})"
        )
    typer.echo(render(loaded.record, fmt, cols), nl=False)


@user_errors
def ls(
    root: Annotated[
        Path, typer.Argument(metavar="ROOT", help="Folder holding runs and sweeps.")
    ] = DEFAULT_ROOT,
    points: Annotated[
        bool, typer.Option("--points", help="Also list the runs inside sweeps.")
    ] = False,
    kind: Annotated[
        str | None, typer.Option("--kind", help="Only runs and sweeps of this kind.")
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", metavar="FORMAT", help="text, markdown, json or csv.")
    ] = "text",
) -> None:
    """List runs and sweeps: time, name, kind, status (complete/incomplete/failed), headline metric.

    Example: cpkv ls experiments --kind alloc_host
    """
    import json
    from dataclasses import asdict

    from cpkv.runs.report import FORMATS, table
    from cpkv.sweep.listing import list_entries

    _format(fmt, FORMATS)
    entries = list_entries(root, points=points, kind=kind)
    if fmt == "json":
        typer.echo(json.dumps([asdict(e) for e in entries], indent=1))
        return
    if not entries and fmt != "csv":
        typer.echo(f"no runs under {root}")
        return
    columns = ["time", "type", "name", "kind", "status", "headline", "path"]
    typer.echo(table([asdict(e) for e in entries], columns, fmt).rstrip("\n"))


@user_errors
def plot(
    target: TargetArg,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Where the PNGs go (default: RUN_OR_SWEEP/plots)."),
    ] = None,
    points: Annotated[
        bool, typer.Option("--points", help="For a sweep, also plot every completed point.")
    ] = False,
) -> None:
    """Write PNG plots of a run or a sweep (needs matplotlib: pip install 'cpkv[plot]').

    \b
    Allocator runs: p50/p99 against request pages, per pattern and impl.
    Runs with ticks (admission): every numeric per-tick field against the tick.
    Sweeps: each headline metric against each swept key.

    Example: cpkv plot experiments/2026-05-01/10-00-00-000000_sweep-host-small
    """
    from cpkv.plots.targets import plot_target

    paths = plot_target(target, output_dir, points=points)
    if not paths:
        typer.echo(f"cpkv: nothing to plot in {target}", err=True)
    for path in paths:
        typer.echo(str(path))
