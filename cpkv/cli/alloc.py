"""``cpkv alloc``: allocator benchmarks."""

from __future__ import annotations

import typer

from cpkv.cli.common import (
    FullOpt,
    OutputDirOpt,
    PlotsOpt,
    PrintConfigOpt,
    args_arg,
    run_kind,
    user_errors,
)
from cpkv.cli.usage import OneLineGroup
from cpkv.runs.rundir import DEFAULT_ROOT

app = typer.Typer(
    cls=OneLineGroup,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Allocator benchmarks: host (L2) and CP shared paged L1.",
)


@app.command("host")
@user_errors
def host(
    args: args_arg("alloc_host.page_size=16") = None,
    output_dir: OutputDirOpt = DEFAULT_ROOT,
    print_config: PrintConfigOpt = False,
    plots: PlotsOpt = None,
    full: FullOpt = False,
) -> None:
    """Benchmark the host (L2 / HiCache) KV allocator: FIFO vs contiguous-preferred selection.

    Without a config the built-in default runs: a 220 GB pool at 100,000 bytes/token
    (34,375 pages of 64 tokens), request pages 1,8,64,512, three free-list patterns.

    Names: impls reference, fast, sglang (alias production; needs sglang); methods fifo,
    contiguous; patterns contiguous_fifo, fragmented_prefix_later_run, random_fragmented,
    no_run; ops alloc, free, mixed; protocols cold, warm.

    Ratios measured side by side in the run: vs_reference (the reference's p50 over the
    row's, when reference runs beside another impl) and vs_fifo_p50 / vs_fifo_p99 (the
    row's p50 / p99 over FIFO's for the same impl and case, when both methods run).

    Example: cpkv alloc host alloc_host.request_pages=[8,64] alloc_host.protocol=warm
    """
    run_kind("alloc_host", args, output_dir, print_config, "cpkv alloc host", plots, full)


@app.command("l1")
@user_errors
def l1(
    args: args_arg("alloc_l1.cp_size=4") = None,
    output_dir: OutputDirOpt = DEFAULT_ROOT,
    print_config: PrintConfigOpt = False,
    plots: PlotsOpt = None,
    full: FullOpt = False,
) -> None:
    """Benchmark the CP shared paged L1 allocator: stats, selection and allocation per owner lane.

    Without a config the built-in default runs seed 003's L1 example on CPU: 8192 and 32768
    physical pages, cp_size 8, page_size 64, request pages 8,64,512, three free patterns x
    three owner patterns, impls fifo,contiguous, op alloc_pages, cold protocol.

    Names: impls fifo, contiguous (alias current), fast_fifo, fast_contiguous (alias
    fast_current); free_patterns sequential, owner_fragmented_later_run, random;
    owner_patterns round_robin, single_owner, zigzag; ops stats, free_room_stats,
    select_only, alloc_pages, free; protocols cold, warm; lane_order sorted, as_given.

    Example: cpkv alloc l1 alloc_l1.impls=[fifo,fast_fifo] alloc_l1.protocol=warm
    """
    run_kind("alloc_l1", args, output_dir, print_config, "cpkv alloc l1", plots, full)
