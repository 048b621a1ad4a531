"""The admit.policy registry: names, dispatch, and what stays with the PrefillAdder model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cpkv.core.errors import ConfigError
from cpkv.core.schema import build
from cpkv.policies.blocks import SCANS, BlockRequest, KvBlocks
from cpkv.policies.iteration import IterationBudget
from cpkv.policies.registry import POLICIES, BlockPolicyInputs, block_policy_names, run_block_policy
from cpkv.policies.victims import VICTIMS


def test_policy_names_and_what_they_read() -> None:
    assert POLICIES.names() == [
        "prefill_adder", "iteration", "conservative", "optimistic", "profiled",
    ]  # fmt: skip
    assert POLICIES.get("profiled").serving_only
    assert list(block_policy_names()) == ["iteration", "conservative", "optimistic"]
    assert POLICIES.get("prefill_adder").run is None
    assert [POLICIES.get(n).reads for n in block_policy_names()] == [
        "iteration",
        "block_requests",
        "block_requests",
    ]
    assert SCANS.names() == ["first_fit", "fcfs_stop", "all_or_error"]
    assert VICTIMS.names() == ["scan_order", "newest_first", "largest_first", "least_progress"]


def test_dispatch_runs_the_seed_examples() -> None:
    inputs = BlockPolicyInputs(requests=(BlockRequest("A", 6, 6), BlockRequest("B", 4, 4)))
    ticks = run_block_policy("iteration", inputs)
    assert [(t.decode_tokens, t.prefill_tokens) for t in ticks] == [(2, 4)] * 3
    assert run_block_policy("conservative", inputs).admitted == ("A",)
    assert run_block_policy("optimistic", inputs).final_used_blocks == 2


def test_unknown_and_tick_model_policies_are_config_errors() -> None:
    with pytest.raises(
        ConfigError,
        match="admit.policy: unknown admission policy .*allowed: prefill_adder, iteration, conservative, optimistic",
    ):
        run_block_policy("greedy", BlockPolicyInputs())
    with pytest.raises(ConfigError, match="tick model"):
        run_block_policy("prefill_adder", BlockPolicyInputs())


def test_blocks_build_from_plain_config_with_full_key_paths() -> None:
    kv = build(KvBlocks, {"block_size": 8, "victim": "largest_first"}, "admit.kv")
    assert kv == KvBlocks(block_size=8, capacity_blocks=4, victim="largest_first")
    assert build(IterationBudget, {"chunk_tokens": 2}, "admit.iteration").chunk_tokens == 2
    with pytest.raises(ConfigError, match=r"admit\.kv\.victim: unknown victim order 'x'"):
        build(KvBlocks, {"victim": "x"}, "admit.kv")
    with pytest.raises(ConfigError, match=r"admit\.iteration\.chunk_tokens: must be > 0"):
        build(IterationBudget, {"chunk_tokens": 0}, "admit.iteration")


def test_importing_the_policies_does_not_import_torch_or_cli_packages() -> None:
    code = "import sys, cpkv.policies.registry, cpkv.admission.token_ratio; print(sorted(m for m in ('torch', 'typer', 'rich', 'omegaconf', 'tabulate') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
