"""``cpkv admit``: prefill admission tick by tick (SGLang's PrefillAdder, HiCache, CP limits)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cpkv.cli.common import (
    FullOpt,
    OutputDirOpt,
    PlotsOpt,
    PrintConfigOpt,
    args_arg,
    run_kind,
    split_args,
    user_errors,
)
from cpkv.runs.rundir import DEFAULT_ROOT

ArgsArg = args_arg("admit.page_size=64")
WriteWorkloadOpt = Annotated[
    Path | None,
    typer.Option(
        "--write-workload",
        metavar="PATH",
        help="Write the configured workload (admit.workload, any source) as JSONL requests to PATH and exit without running.",
    ),
]


@user_errors
def admit(
    args: ArgsArg = None,
    output_dir: OutputDirOpt = DEFAULT_ROOT,
    print_config: PrintConfigOpt = False,
    plots: PlotsOpt = None,
    full: FullOpt = False,
    write_workload: WriteWorkloadOpt = None,
) -> None:
    """Group waiting requests into prefill batches, tick by tick, and name the budget that stops each.

    Without a config the built-in default runs the seed's synthetic grid: L1 hits 0,4096 x
    L2 hits 0,4096 x extend 128,2048, 20000 free L1 slots, max_prefill_tokens 16384, CP
    limits 65536 extend tokens and 8 requests per batch. admit.backend=sglang runs the same
    workload through the real sglang PrefillAdder (when installed; CP limits off).

    admit.policy=iteration|conservative|optimistic runs the block policies instead of
    the PrefillAdder: iteration reads the admit.iteration token budget, conservative and
    optimistic the admit.kv block pool (configs/admit/seed004_iteration.yaml,
    configs/admit/seed004_blocks.yaml).

    admit.mode=serving runs the serving simulation around a policy: arrivals, decode first,
    chunked prefill, KV growth and preemption, TTFT/TPOT/goodput
    (configs/admit/serving_mooncake.yaml). There admit.schedule_policy orders the queue
    (SGLang's fcfs, lof, random, lpm, dfs-weight, hrrn, shortest-prefill-first; cpkv's
    deadline), admit.policy=profiled reserves a quantile of the output lengths seen, and
    admit.serving.on_preempt=swap, queue_timeout_ms, check_invariants add cpkv's lifecycle
    (configs/sweeps/policies.yaml runs them all).

    admit.engine=vllm runs vLLM 0.32.0's V1 scheduler instead (admit.vllm: its knobs under
    vLLM's names): in mode passes a queue step by step (configs/admit/vllm_queue.yaml), in
    mode serving the same simulation around it (configs/admit/serving_vllm.yaml).

    Names: admit.workload.source grid, jsonl, trace, synthetic; admit.workload.format
    mooncake, azure_csv; admit.backend model, sglang; admit.policy prefill_adder, iteration,
    conservative, optimistic, profiled; admit.kv.scan first_fit, fcfs_stop, all_or_error;
    admit.kv.victim scan_order, newest_first, largest_first, least_progress;
    admit.arrivals.process trace, poisson, zero; admit.workload.prefix.model none, shared;
    admit.cost.kind roofline, linear; admit.cost.model llama-2-7b, llama-2-70b, llama-3-8b,
    llama-3-70b, qwen-72b, codellama-34b (dense); mixtral-8x7b, qwen3-30b-a3b,
    qwen3-235b-a22b (experts); deepseek-v3, deepseek-v3.2 (latent attention and experts);
    admit.cost.gpu a100-80gb (a100), h100-sxm (h100), measured; a100-40gb, a40, l40s, h200
    (h200-sxm), b200 from datasheets with a borrowed calibration; admit.cost.cpu.engine
    sglang, vllm, none (null: admit.engine's);
    admit.cluster.router round_robin, random, least_requests, least_tokens, prefix_aware,
    power_of_two (admit.cluster.instances: how many instances behind it).

    Example: cpkv admit configs/admit/seed_jsonl.yaml admit.page_size=64 admit.chunked_prefill_size=8192
    """
    if write_workload is not None:
        _write_workload(args, write_workload)
        return
    run_kind("admit", args, output_dir, print_config, "cpkv admit", plots, full)


def _write_workload(args: list[str] | None, path: Path) -> None:
    from cpkv.core.config import load_config
    from cpkv.workload.jsonl_writer import export_workload

    config, overrides = split_args(args)
    loaded = load_config("admit", config, overrides, command="cpkv admit")
    loaded.spec.check_memory(loaded.experiment)
    cfg = loaded.experiment
    count = export_workload(cfg.admit.workload, cfg.seed, path)
    typer.echo(f"wrote {count} requests ({cfg.admit.workload.source} workload) to {path}")


PointsArg = Annotated[
    Path | None,
    typer.Argument(
        metavar="[POINTS.jsonl]",
        help="Measured iterations, one JSON object per line (fits kind linear).",
        show_default=False,
    ),
]
ProfileOpt = Annotated[
    Path | None,
    typer.Option(
        "--profile",
        metavar="DIR",
        help="A Vidur profile folder (mlp.csv) to fit kind roofline's calibration to; with --table, a folder of them.",
    ),
]


@user_errors
def fit_cost(
    points: PointsArg = None,
    kv_bytes_per_token: Annotated[
        int,
        typer.Option(
            "--kv-bytes-per-token",
            help="KV bytes per token (turns the load coefficient into GB/s).",
        ),
    ] = 131072,
    profile: ProfileOpt = None,
    tp: Annotated[int, typer.Option("--tp", help="With --profile: the TP degree to fit.")] = 1,
    network: Annotated[
        Path | None,
        typer.Option(
            "--network",
            metavar="CSV",
            help="With --profile: the all-reduce table (default: ../network_<gpu>_dgx/all_reduce.csv beside the profile).",
        ),
    ] = None,
    table: Annotated[
        bool,
        typer.Option(
            "--table",
            help="With --profile: the validation table of every profile under DIR (every TP) and the GPUs' defaults.",
        ),
    ] = False,
    fmt: Annotated[str, typer.Option("--format", help="With --table: text or markdown.")] = "text",
) -> None:
    """Fit the serving cost model (admit.cost) to measurements and print the admit.cost block.

    POINTS.jsonl (kind linear): measured iterations, each line holding time_us and the
    iteration's prefill_tokens, decode_requests, context_tokens and loaded_tokens (missing: 0);
    non-negative least squares; admit.cost.fit_points=POINTS.jsonl fits inside a serving run.

    --profile DIR (kind roofline): Vidur's per-operator GPU timings (mlp.csv, and the
    all-reduce table beside it); fits the measured calibration keys for one TP degree and
    prints the block with the errors. --table prints the validation table instead.

    Examples: cpkv fit-cost configs/examples/points.jsonl;
    cpkv fit-cost --profile ../shared/data/gpu_profiles/a100_meta-llama_Meta-Llama-3-8B --tp 1;
    cpkv fit-cost --profile ../shared/data/gpu_profiles --table
    """
    from cpkv.core.errors import ConfigError

    if (points is None) == (profile is None):
        raise ConfigError(
            "cpkv fit-cost: give POINTS.jsonl (kind linear) or --profile DIR (kind roofline), one of them"
        )
    if profile is not None:
        typer.echo(_fit_profile(profile, tp, network, table, fmt))
        return
    assert points is not None
    if table:
        raise ConfigError("--table: goes with --profile DIR")
    from cpkv.serving.cost.fitting.linear import fit_cost as fit
    from cpkv.serving.cost.fitting.linear import read_points
    from cpkv.serving.cost.model import CostModel

    if kv_bytes_per_token <= 0:
        raise ConfigError(f"--kv-bytes-per-token: must be > 0, got {kv_bytes_per_token}")
    result = fit(
        read_points(points), CostModel(kv_bytes_per_token=kv_bytes_per_token), source=str(points)
    )
    lines = [
        f"# fitted to {result.points} points of {points}: rms error {result.rms_error_us:.6g} us, "
        f"max {result.max_abs_error_us:.6g} us, mean relative error {result.mean_rel_error_pct:.4g}%, "
        f"r2 {result.r2:.6f}",
    ]
    if result.kept:
        lines.append(f"# not in the points (kept at the defaults): {', '.join(result.kept)}")
    lines += ["admit:", "  cost:"]
    for key, value in result.model.describe().items():
        shown = "null" if value is None else f"{value:.6g}" if isinstance(value, float) else value
        lines.append(f"    {key}: {shown}")
    typer.echo("\n".join(lines))


def _fit_profile(profile: Path, tp: int, network: Path | None, table: bool, fmt: str) -> str:
    from cpkv.core.errors import ConfigError
    from cpkv.serving.cost.fitting.profiles import read_profile
    from cpkv.serving.cost.fitting.report import profile_block, validation_table
    from cpkv.serving.cost.fitting.roofline import fit_profile

    if fmt not in ("text", "markdown"):
        raise ConfigError(f"--format: unknown format {fmt!r} (allowed: text, markdown)")
    if table:
        return validation_table(profile, fmt)
    if tp < 1:
        raise ConfigError(f"--tp: must be >= 1, got {tp}")
    return profile_block(fit_profile(read_profile(profile), tp, network))
