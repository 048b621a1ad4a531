"""The ``admit.cluster`` block: how many instances, behind which router.

Defaults of the ``prefix_aware`` thresholds are SGLang router's (``sglang_router/router_args.py``:
``cache_threshold`` 0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5,
``eviction_interval_secs`` 120); its ``max_tree_size`` (2**26 characters) has no block
equivalent, so ``max_tree_blocks`` defaults to null (never evict).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from cpkv.core.schema import Range, choices, require
from cpkv.core.schema.keys import belongs_to
from cpkv.core.schema.limits import CLOCK_LIMIT_S, CLOCK_WHY, MAX_TOKENS, TOKENS_WHY, Tokens

if TYPE_CHECKING:
    from cpkv.serving.cluster.routers import RouterSettings

MAX_INSTANCES = 4096
PREFIX_AWARE = "prefix_aware"
PREFIX_AWARE_KEYS = (
    "cache_threshold", "balance_abs_threshold", "balance_rel_threshold", "eviction_interval_s",
    "max_tree_blocks",
)  # fmt: skip
"""The settings only the prefix_aware router reads."""


@dataclass(frozen=True)
class ClusterSpec:
    """``admit.cluster``:

    * ``instances``: copies of the configured serving instance (each its own KV pool, L1
      prefix cache and L2), ``shared_l2``: one L2 pool for all (as Mooncake's store is), of
      ``instances`` x ``admit.workload.cache.l2_tokens`` (the instances' host memory pooled);
    * ``router``: a name of :data:`cpkv.serving.cluster.routers.ROUTERS`;
    * ``cache_threshold``, ``balance_abs_threshold``, ``balance_rel_threshold``,
      ``eviction_interval_s``, ``max_tree_blocks``: the ``prefix_aware`` router's settings
      (:mod:`cpkv.serving.cluster.routers`); with another router, one set to other than its
      default is refused (nothing would read it).
    """

    instances: int = 1
    router: str = "round_robin"
    shared_l2: bool = False
    cache_threshold: float = 0.3
    balance_abs_threshold: Tokens = 64
    balance_rel_threshold: Annotated[
        float,
        Range(
            1,
            1e9,
            why="a billion times the least loaded instance's load",
            low_why="max load > min load x this",
        ),
    ] = 1.5
    eviction_interval_s: Annotated[float, Range(0, CLOCK_LIMIT_S, low_open=True, why=CLOCK_WHY)] = (
        120.0
    )
    max_tree_blocks: Annotated[int, Range(0, MAX_TOKENS, low_open=True, why=TOKENS_WHY)] | None = (
        None
    )

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
        if self.router != PREFIX_AWARE:
            belongs_to(
                self, PREFIX_AWARE_KEYS, owner="admit.cluster.router", needed=PREFIX_AWARE,
                chosen=self.router, reads=(),
            )  # fmt: skip

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
