"""``cpkv validate``: the cost model against published measurements (:mod:`cpkv.validate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cpkv.cli.common import user_errors
from cpkv.core.errors import ConfigError

DEFAULT_FOLDER = Path("configs/validation")


@user_errors
def validate(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="[CASE.yaml | FOLDER]...",
            show_default=False,
            help="Validation cases, or folders of them (default: configs/validation).",
        ),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="text or markdown.")] = "text",
) -> None:
    """Print the cost model's predictions beside published measurements of real GPUs.

    Each case (configs/validation/*.yaml) is a published number with its source and setup,
    and the admit.cost block that describes the setup: a static batch (batch, prompt_tokens,
    output_tokens) priced iteration by iteration. Prints published, predicted and the error
    per metric, then the median and worst |error|; exits 1 when a prediction beats a physical
    bound (the weights and KV each decode step must read, the FLOPs each prefill must compute,
    at the datasheet's peaks).

    Example: cpkv validate configs/validation
    """
    from cpkv.runs.report import table
    from cpkv.validate.report import COLUMNS
    from cpkv.validate.report import validate as run

    if fmt not in ("text", "markdown"):
        raise ConfigError(f"--format: unknown format {fmt!r} (allowed: text, markdown)")
    report = run(list(paths) if paths else [DEFAULT_FOLDER])
    shown = [c for c in COLUMNS if fmt == "text" or c != "setup"]
    typer.echo(table(report.rows, shown, fmt))
    typer.echo(
        f"\n{len(report.rows)} published numbers: median |error| {report.median_pct:.1f}%, "
        f"worst {report.worst_pct:.1f}% ({report.worst_case})"
    )
    if report.violations:
        typer.echo("predictions below a physical bound:\n  " + "\n  ".join(report.violations))
        raise typer.Exit(1)
    typer.echo("no prediction beats its physical bound")
