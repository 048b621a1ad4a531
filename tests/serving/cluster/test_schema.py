"""The admit.cluster block: defaults and validation."""

from __future__ import annotations

import pytest

from cpkv.core.config import load_config
from cpkv.core.errors import ConfigError
from tests.helpers.paths import CONFIGS


def test_defaults_are_one_instance_and_sgl_routers_thresholds() -> None:
    block = load_config("admit", CONFIGS / "serving.yaml").experiment.admit.cluster
    assert (block.instances, block.router, block.shared_l2) == (1, "round_robin", False)
    # sglang_router/router_args.py: cache_threshold 0.3, balance_abs_threshold 64,
    # balance_rel_threshold 1.5, eviction_interval_secs 120
    settings = block.router_settings()
    assert (settings.cache_threshold, settings.balance_abs_threshold,
            settings.balance_rel_threshold, settings.eviction_interval_s) == (0.3, 64, 1.5, 120.0)  # fmt: skip


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("admit.cluster.instances=0", "admit.cluster.instances: must be in [1, 4096], got 0"),
        ("admit.cluster.router=prefix", "admit.cluster.router: unknown value 'prefix'"),
        (
            "admit.cluster.cache_threshold=1.5",
            "admit.cluster.cache_threshold: must be a share of the prompt in [0, 1]",
        ),
        (
            "admit.cluster.balance_rel_threshold=0.9",
            "admit.cluster.balance_rel_threshold: must be >= 1",
        ),
        ("admit.cluster.max_tree_blocks=0", "admit.cluster.max_tree_blocks: must be > 0"),
    ],
)
def test_bad_cluster_values_are_one_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("admit", CONFIGS / "serving.yaml", [override])
    assert message in str(err.value) and str(err.value).startswith(f"override {override!r}: ")


def test_several_instances_need_the_serving_mode() -> None:
    with pytest.raises(ConfigError, match="2 instances need admit.mode serving; allowed here: 1"):
        load_config("admit", None, ["admit.cluster.instances=2"])


def test_several_instances_are_accepted_in_mode_serving() -> None:
    block = load_config("admit", CONFIGS / "serving.yaml", ["admit.cluster.instances=4"])
    assert block.experiment.admit.cluster.instances == 4


def test_a_refused_cluster_run_writes_nothing(cli) -> None:
    res = cli("admit", str(CONFIGS / "serving.yaml"), "admit.cluster.instances=5000")
    assert res.exit_code == 2 and not cli.root.exists()
    assert res.output.strip() == (
        "cpkv: error: override 'admit.cluster.instances=5000': admit.cluster.instances: must be "
        "in [1, 4096], got 5000"
    )
