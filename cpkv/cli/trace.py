"""``cpkv trace``: request traces through the tiered (L1 device / L2 host) prefix-cache model."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Annotated

import typer

from cpkv.cli.common import (
    FullOpt,
    OutputDirOpt,
    PlotsOpt,
    PrintConfigOpt,
    is_path_arg,
    run_kind,
    user_errors,
)
from cpkv.cli.usage import OneLineGroup
from cpkv.core.errors import ConfigError
from cpkv.runs.rundir import DEFAULT_ROOT

app = typer.Typer(
    cls=OneLineGroup,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Request traces (Mooncake format) through the L1/L2 prefix-cache model.",
)

TraceArgs = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[TRACE] [CONFIG.yaml] [KEY=VALUE]...",
        help="The trace file, an optional YAML config (.yaml/.yml), then dotlist overrides (trace.cache.l1_tokens=1000000).",
        show_default=False,
    ),
]
_PLAIN = re.compile(r"[A-Za-z0-9_./~+-]+")


def with_trace_path(args: Sequence[str] | None) -> list[str]:
    """``TRACE [CONFIG.yaml] KEY=VALUE...`` -> the common ``[CONFIG.yaml] KEY=VALUE...`` form,
    the trace becoming the override ``trace.path=<absolute path>``."""
    out, trace = [], None
    for item in args or ():
        is_config = item.endswith((".yaml", ".yml"))
        if is_config or ("=" in item and not is_path_arg(item)):
            out.append(item)
        elif trace is None:
            trace = item
        else:
            raise ConfigError(
                f"one trace per run; got {trace!r} and {item!r} (overrides are KEY=VALUE)"
            )
    if trace is not None:
        path = os.path.abspath(trace)
        if not _PLAIN.fullmatch(path):
            path = "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"
        out.append(f"trace.path={path}")
    return out


@app.command("stats")
@user_errors
def stats(
    args: TraceArgs = None,
    output_dir: OutputDirOpt = DEFAULT_ROOT,
    print_config: PrintConfigOpt = False,
    plots: PlotsOpt = None,
    full: FullOpt = False,
) -> None:
    """Trace statistics: lengths, arrivals, and the cache ratio unlimited and at L1/L2 capacities.

    The cache ratio is cached prompt tokens / prompt tokens; a request's cached tokens are the
    longest run of its leading blocks already cached (L1, then L2), capped at input_length - 1
    and rounded down to trace.cache.page_size. Default capacities: L1 2,097,152 tokens, L2
    hicache_ratio 2 x L1.

    Example: cpkv trace stats ../shared/data/mooncake_synthetic_trace.jsonl trace.cache.l1_tokens=4000000
    """
    run_kind(
        "trace_stats", with_trace_path(args), output_dir, print_config, "cpkv trace stats",
        plots, full,
    )  # fmt: skip


@app.command("curve")
@user_errors
def curve(
    args: TraceArgs = None,
    output_dir: OutputDirOpt = DEFAULT_ROOT,
    print_config: PrintConfigOpt = False,
    plots: PlotsOpt = None,
    full: FullOpt = False,
) -> None:
    """Hit ratio against cache capacity (a table; with --plots, plots/capacity_curve.png).

    L1 capacity is each of curve.fractions times the working set (the tokens of all distinct
    blocks); L2 is curve.hicache_ratio x L1, or off when null (the default, as in the Mooncake
    paper's Figure 9).

    Example: cpkv trace curve ../shared/data/mooncake_synthetic_trace.jsonl curve.hicache_ratio=2
    """
    run_kind(
        "trace_curve", with_trace_path(args), output_dir, print_config, "cpkv trace curve",
        plots, full,
    )  # fmt: skip
