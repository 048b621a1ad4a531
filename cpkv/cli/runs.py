"""``cpkv diff``, ``cpkv show``, ``cpkv ls``, ``cpkv plot``: working with saved runs and sweeps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cpkv.cli.common import fail, user_errors
from cpkv.core.errors import ConfigError
from cpkv.core.suggest import did_you_mean
from cpkv.runs.rundir import DEFAULT_ROOT

TargetArg = Annotated[
    Path,
    typer.Argument(
        metavar="RUN_OR_SWEEP", help="A run directory or a sweep directory.", show_default=False
    ),
]


def _format(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        hint = did_you_mean(value, allowed)
        raise ConfigError(f"--format {value}: unknown format{hint} (allowed: {', '.join(allowed)})")
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
            help="Change (%) a metric must exceed to count; METRIC may be a name, 'timing', 'other' or '*' (repeatable; default other:0). On a timing metric (a name or 'timing') it sets that metric's factor to 1 + PCT/100; '*' and 'other' cover the other metrics.",
        ),
    ] = None,
    factor: Annotated[
        float,
        typer.Option(
            "--factor",
            metavar="F",
            help="A timing change counts only when B/A or A/B exceeds F (and it is significant), as asv.",
        ),
    ] = 1.1,
    alpha: Annotated[
        float,
        typer.Option(
            "--alpha",
            metavar="P",
            help="Significance level of the test on timing samples (the rank test; with --rerun the paired test), after Benjamini-Hochberg: a timing change counts only when p < P.",
        ),
    ] = 0.05,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            "-m",
            metavar="METRIC",
            help="Compare only these row metrics (repeatable; default: the metrics of the kind's table).",
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
    show_all: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Show every summary value and every row metric, unchanged ones too, without the screenful cap.",
        ),
    ] = False,
    only_changed: Annotated[
        bool,
        typer.Option(
            "--only-changed", hidden=True, help="(The default now: only changes are listed.)"
        ),
    ] = False,
    rerun: Annotated[
        bool,
        typer.Option(
            "--rerun",
            help="Run A's and B's configs again, interleaved A, B, A, B, ... on this machine, and judge each row in pairs (timed kinds only).",
        ),
    ] = False,
    rounds: Annotated[
        int | None,
        typer.Option(
            "--rounds",
            metavar="N",
            help="With --rerun: rounds of A then B (default 5, at least 3).",
        ),
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            "-o",
            help="With --rerun: keep the runs in a new folder under this one (default: a temporary folder, removed).",
        ),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", metavar="FORMAT", help="text, markdown or json.")
    ] = "text",
) -> None:
    """Compare two runs (or two sweeps): config, summary and headline first, then the rows that changed.

    \b
    1. config differences (A -> B);
    2. the summary: every headline number, and every other summary value that changed
       (ticks, stops_by_budget.*, goodput, ...), with a verdict where its direction is
       known (worse / better), 'changed' where it is not;
    3. the rows, matched on their identity columns (never by position; an admission run's
       ticks are compared per request: the tick that admitted each rid, its prefix and
       extend tokens): only the metrics that got worse or better, worst first, at most
       15 rows, with counts of the rest (--all: every row and metric).

    \b
    Two serving runs (admit.mode=serving) get one ranked verdict instead: goodput
    first, then requests lost (timed out, rejected, cancelled: each counts against
    its run), then latency (TTFT, TPOT, E2E at p50 and p99), then costs (recompute
    and swap bytes, preemptions); the first tier in which a metric moved (by more than
    1% for goodput and latency, at all for lost requests and costs; -t sets it) decides,
    and the verdict names it (IMPROVEMENT (decided by goodput_requests_per_s ...)). A table
    shows one metric a row; then the requests that changed, matched on rid in
    requests.jsonl (lost, preempted, admitted later or earlier), with their rids.

    \b
    A timing metric (p50_us, p99_us, ...) changes only when it moved by more than
    --factor (1.1: B/A > 1.1 or A/B > 1.1) and its rows' raw samples differ: a two-sided
    Mann-Whitney U test, p < --alpha (0.05) after Benjamini-Hochberg over the rows, as asv
    and pyperf do; beyond the factor but not significant, it is 'noise'. Rows without raw
    samples (results written before cpkv kept them) fall back to the interval rule (a
    median: p50 +- 1.58 IQR/sqrt(n)). Other metrics are deterministic: they change when
    |change| exceeds their threshold (default 0%).

    \b
    --rerun settles a timing question on this machine: it runs A's and B's configs again
    (config.yaml, same seeds), A, B, A, B, ... for --rounds rounds, and judges each row's
    statistics in pairs: the change is the geometric mean of the rounds' B/A, and it counts
    when beyond --factor and significant by a paired t-test of log(B/A) over the rounds.
    For timed kinds (alloc_host, alloc_l1); the runs go to a temporary folder (-o DIR
    keeps them), never beside A and B.

    \b
    Exit code: 0 no regression, 1 something got worse (a CI gate), 2 unusable input
    (not a run, unsupported schema version, different kinds, no rows matched; with
    --rerun: a kind without timings, a config that cannot run here).

    \b
    Examples:
      cpkv diff experiments/2026-05-01/10-00-00-000000_host experiments/2026-05-02/09-00-00-000000_host -t p99_us:20
      cpkv diff RUN_A RUN_B --rerun --rounds 5
    """
    import sys

    from cpkv.cli.common import progress_printer
    from cpkv.diff.compare import Thresholds, diff_paths
    from cpkv.diff.render import DIFF_FORMATS, render_diff

    _format(fmt, DIFF_FORMATS)
    th = Thresholds.parse(threshold or [], factor)
    if not rerun and (rounds is not None or output_dir is not None):
        given = "--rounds" if rounds is not None else "-o/--output-dir"
        raise ConfigError(f"{given}: only with --rerun (a plain diff reads the saved results)")
    if rerun:
        from cpkv.diff.rerun.runs import DEFAULT_ROUNDS, rerun_paths

        result = rerun_paths(
            str(a), str(b), DEFAULT_ROUNDS if rounds is None else rounds, output_dir, th,
            metric or [], ignore or [], alpha, argv=sys.argv, progress=progress_printer(),
        )  # fmt: skip
    else:
        result = diff_paths(str(a), str(b), th, metric or [], ignore or [], alpha)
    typer.echo(render_diff(result, fmt, show_all), nl=False)
    if result.regressions:
        raise typer.Exit(1)
    if not result.matched and (result.only_a or result.only_b):
        raise fail("no rows matched, no row was compared (see the notes above)")


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
            help="Table columns (default: the kind's table columns; a sweep's: one table per kind). An unknown column is an error naming the allowed ones.",
        ),
    ] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full", help="Print every row (a long table shows its first and last rows)."
        ),
    ] = False,
) -> None:
    """Re-render a run's table from its results.json (a sweep's: its summary).

    \b
    Examples:
      cpkv show experiments/2026-05-01/10-00-00-000000_host --format markdown
      cpkv show SWEEP_DIR -c point,config,status,ticks
    """
    from cpkv.runs.report import FORMATS, render
    from cpkv.sweep.listing import SweepView, open_target
    from cpkv.sweep.store import summary_columns, summary_table

    _format(fmt, FORMATS)
    loaded = open_target(target)
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns is not None else None
    if columns is not None and not cols:
        raise ConfigError("--columns: name at least one column")
    if isinstance(loaded, SweepView):
        from cpkv.capacity.store import resume_command

        loaded.readable_summary(resume_command(loaded.path))
        _check_columns(cols, summary_columns(loaded.summary), "this sweep's summary")
        if fmt == "json":
            import json

            typer.echo(json.dumps(loaded.summary, indent=1))
            return
        typer.echo(summary_table(loaded.summary, fmt, cols), nl=False)
        return
    known = list(dict.fromkeys(c for row in loaded.record.rows for c in row))
    _check_columns(cols, known, "this run")
    typer.echo(render(loaded.record, fmt, cols, terminal=not full), nl=False)


def _check_columns(cols: list[str] | None, known: list[str], what: str) -> None:
    bad = [c for c in cols or [] if c not in known]
    if bad:
        raise ConfigError(
            f"--columns {bad[0]}: not a column of {what}{did_you_mean(bad[0], known)} "
            f"(columns: {', '.join(known)})"
        )


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
    """List runs and sweeps: time, name, kind, status, overrides, headline metric.

    The overrides column tells runs of one config apart: a run's command-line overrides
    (admit.cp.max_batch_requests=4), a sweep's swept keys.

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
    columns = ["time", "type", "name", "kind", "status", "overrides", "headline", "path"]
    if not any(e.overrides for e in entries):
        columns.remove("overrides")
    rows = [asdict(e) for e in entries]
    if fmt != "csv":  # a sweep of many kinds: say how many, not all of them
        for row in rows:
            kinds = row["kind"].split(",")
            if len(kinds) > 2:
                row["kind"] = f"{len(kinds)} kinds"
    typer.echo(table(rows, columns, fmt).rstrip("\n"))


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
    Allocator runs: p50/p99 against request pages, per pattern and impl (bars
      when one request size ran).
    Runs with ticks (admission): every numeric per-tick field against the tick,
      12 panels a file; beyond 300 ticks, the mean of each bin and its min..max.
    Serving runs: KV utilisation over time, TTFT/TPOT CDFs with the SLOs.
    Trace curve runs: the hit ratio against the cache capacity.
    Sweeps: each headline metric against each swept key, from the points that
      swept it, one line per value of the other keys that vary.

    Example: cpkv plot experiments/2026-05-01/10-00-00-000000_sweep-host-small
    """
    from cpkv.plots.targets import plot_target

    paths = plot_target(target, output_dir, points=points)
    if not paths:
        typer.echo(f"cpkv: nothing to plot in {target}", err=True)
    for path in paths:
        typer.echo(str(path))
