"""The ``admit.cluster`` block: how many instances, behind which router.

Defaults of the ``prefix_aware`` thresholds are SGLang router's (``sglang_router/router_args.py``:
``cache_threshold`` 0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5,
``eviction_interval_secs`` 120); its ``max_tree_size`` (2**26 characters) has no block
equivalent, so ``max_tree_blocks`` defaults to null (never evict).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from cpkv.core.schema import FieldError, Range, choices, require
from cpkv.core.schema.keys import belongs_to
from cpkv.core.schema.limits import CLOCK_LIMIT_S, CLOCK_WHY, MAX_TOKENS, TOKENS_WHY, Tokens
from cpkv.serving.cluster.disagg.schema import DecodePool, LinkSpec, PrefillPool

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
      default is refused (nothing would read it);
    * ``prefill``, ``decode``, ``link``: a disaggregated deployment (both pools given): a
      prefill pool and a decode pool, each behind its own router, and the link the KV moves
      over (:mod:`cpkv.serving.cluster.disagg.schema`); ``instances`` and ``router`` are then
      per pool, ``shared_l2`` and the ``prefix_aware`` settings apply to the pools whose
      router reads them.
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
    prefill: PrefillPool | None = None
    decode: DecodePool | None = None
    link: LinkSpec = LinkSpec()

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode run in separate pools."""
        return self.prefill is not None

    def routers(self) -> tuple[str, ...]:
        """The routers the run uses: one, or the prefill pool's and the decode pool's."""
        if self.prefill is not None and self.decode is not None:
            return (self.prefill.router, self.decode.router)
        return (self.router,)

    def validate(self) -> None:
        from cpkv.serving.cluster.routers import ROUTERS

        if (self.prefill is None) != (self.decode is None):
            have, lack = ("prefill", "decode") if self.decode is None else ("decode", "prefill")
            raise FieldError(
                lack,
                f"a disaggregated deployment needs both pools: admit.cluster.{have} is given, "
                f"give admit.cluster.{lack} too (e.g. {lack}: {{instances: 1}})",
            )
        if self.prefill is not None:
            self._validate_pools()
            return
        if self.link != LinkSpec():
            raise FieldError(
                "link",
                "the link between a prefill and a decode pool; give admit.cluster.prefill and "
                "admit.cluster.decode, or leave admit.cluster.link out",
            )
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

    def _validate_pools(self) -> None:
        default = ClusterSpec()
        for key, per_pool in (("instances", "prefill.instances and decode.instances"),
                              ("router", "prefill.router and decode.router")):  # fmt: skip
            if getattr(self, key) != getattr(default, key):
                raise FieldError(
                    key,
                    f"with prefill and decode pools, {key} is per pool: admit.cluster.{per_pool}",
                )
        require(
            0 <= self.cache_threshold <= 1,
            "cache_threshold",
            f"must be a share of the prompt in [0, 1], got {self.cache_threshold}",
        )
        if PREFIX_AWARE not in self.routers():
            belongs_to(
                self, PREFIX_AWARE_KEYS, owner="admit.cluster.prefill.router", needed=PREFIX_AWARE,
                chosen=self.prefill.router, reads=(),
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
