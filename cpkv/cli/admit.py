"""``cpkv admit``: prefill admission tick by tick (SGLang's PrefillAdder, HiCache, CP limits)."""

from __future__ import annotations

from cpkv.cli.common import ArgsArg, OutputDirOpt, PrintConfigOpt, run_kind, user_errors
from cpkv.experiment import DEFAULT_ROOT


@user_errors
def admit(
    args: ArgsArg = None,
    output_dir: OutputDirOpt = DEFAULT_ROOT,
    print_config: PrintConfigOpt = False,
) -> None:
    """Group waiting requests into prefill batches, tick by tick, and name the budget that stops each.

    Without a config the built-in default runs the seed's synthetic grid: L1 hits 0,4096 x
    L2 hits 0,4096 x extend 128,2048, 20000 free L1 slots, max_prefill_tokens 16384, CP
    limits 65536 extend tokens and 8 requests per batch. admit.backend=sglang runs the same
    workload through the real sglang PrefillAdder (when installed; CP limits off).

    Example: cpkv admit configs/admit/seed_jsonl.yaml admit.page_size=64 admit.chunked_prefill_size=8192
    """
    run_kind("admit", args, output_dir, print_config, "cpkv admit")
