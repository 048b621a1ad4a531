"""The ``admit.cluster`` block: how many instances, behind which router.

Defaults of the ``prefix_aware`` thresholds are SGLang router's (``sglang_router/router_args.py``:
``cache_threshold`` 0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5,
``eviction_interval_secs`` 120); its ``max_tree_size`` (2**26 characters) has no block
equivalent, so ``max_tree_blocks`` defaults to null (never evict).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cpkv.core.schema import choices, non_negative, positive, require

if TYPE_CHECKING:
    from cpkv.serving.cluster.routers import RouterSettings

MAX_INSTANCES = 4096


@dataclass(frozen=True)
class ClusterSpec:
    """``admit.cluster``:

    * ``instances``: copies of the configured serving instance (each its own KV pool, L1
      prefix cache and L2), ``shared_l2``: one L2 pool for all (as Mooncake's store is), of
      ``instances`` x ``admit.workload.cache.l2_tokens`` (the instances' host memory pooled);
    * ``router``: a name of :data:`cpkv.serving.cluster.routers.ROUTERS`;
    * ``cache_threshold``, ``balance_abs_threshold``, ``balance_rel_threshold``,
      ``eviction_interval_s``, ``max_tree_blocks``: the ``prefix_aware`` router's settings
      (:mod:`cpkv.serving.cluster.routers`).
    """

    instances: int = 1
    router: str = "round_robin"
    shared_l2: bool = False
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_blocks: int | None = None

    def validate(self) -> None:
        from cpkv.serving.cluster.routers import ROUTERS

        require(
            1 <= self.instances <= MAX_INSTANCES,
            "instances",
            f"must be in [1, {MAX_INSTANCES}], got {self.instances}",
        )
        choices("router", (self.router,), ROUTERS.allowed())
        require(
            0 <= self.cache_threshold <= 1,
            "cache_threshold",
            f"must be a share of the prompt in [0, 1], got {self.cache_threshold}",
        )
        non_negative("balance_abs_threshold", self.balance_abs_threshold)
        require(
            self.balance_rel_threshold >= 1,
            "balance_rel_threshold",
            f"must be >= 1 (max load > min load x this), got {self.balance_rel_threshold}",
        )
        positive("eviction_interval_s", self.eviction_interval_s)
        positive("max_tree_blocks", self.max_tree_blocks, allow_none=True)

    def router_settings(self) -> RouterSettings:
        """The settings the routers are built from."""
        from cpkv.serving.cluster.routers import RouterSettings

        return RouterSettings(
            self.cache_threshold,
            self.balance_abs_threshold,
            self.balance_rel_threshold,
            self.eviction_interval_s,
            self.max_tree_blocks,
        )
