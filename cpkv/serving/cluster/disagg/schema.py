"""The pools of a disaggregated deployment (``admit.cluster.prefill``, ``admit.cluster.decode``)
and the link between them (``admit.cluster.link``).

A pool is ``instances`` copies of one serving instance behind its own router. Each pool may
run its own parallelism and GPU (``cost``: ``gpu``, ``tp``, ``pp``, ``ep`` replacing
``admit.cost``'s; the model and its KV bytes stay the run's, as both sides must hold the
same KV), its own KV pool (``capacity_blocks``, null: ``admit.kv.capacity_blocks``) and the
scheduler settings that side reads: the prefill pool its prefill budgets
(``max_prefill_tokens``, ``chunked_prefill_size``; null: ``admit``'s), the decode pool its
running limit (``max_running_requests``) and SGLang's reserve per decoding request
(``reserved_decode_tokens``, SGLang's ``SGLANG_NUM_RESERVED_DECODE_TOKENS``, default 512).

The link (:mod:`cpkv.serving.cluster.disagg.link`): ``kind`` picks a preset (numbers per
GPU, one direction), ``gb_per_s`` and ``latency_us`` replace its numbers:

* ``infiniband``: 45 GB/s, 12 µs: one 400 Gb/s NDR NIC per GPU (a DGX H100's eight
  ConnectX-7), of whose 50 GB/s Mooncake's transfer engine moved 45 GB/s
  (kvcache-ai/Mooncake#1668); the latency is the intercept of a latency + bandwidth line
  through UCCL's P2P engine's measured writes (19.6 GB/s at 1.18 MB, 24.2 GB/s at 151 MB:
  11.5 µs and 24.2 GB/s; uccl-project/uccl#999);
* ``roce``: 23.75 GB/s, 12 µs: Mooncake's transfer engine's 190 GB/s over eight 400 Gb/s
  RoCE NICs (the Mooncake project's published benchmark), per NIC;
* ``nvlink``: 450 GB/s, 4 µs: NVLink 4 on H100/H200 (900 GB/s both directions, NVIDIA's
  datasheet: the prefill and decode GPUs in one NVLink domain); the latency of SGLang's
  NVLink all-reduce on two GPUs (3.8 µs, :data:`cpkv.serving.cost.allreduce.CUSTOM_ALLREDUCE`);
* ``instant``: no time at all (a bound, and the colocated timeline's check).

A transfer uses ``min(prefill GPUs, decode GPUs)`` such lanes (each GPU sends its shard of
the heads or layers over its own NIC or links).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any

from cpkv.core.schema import FieldError, Range, choices
from cpkv.core.schema.limits import CLOCK_LIMIT_US, CLOCK_WHY, MAX_TOKENS, TOKENS_WHY

if TYPE_CHECKING:
    from cpkv.serving.cost.spec import CostSpec

MAX_POOL_INSTANCES = 4096
MAX_LINK_GB_PER_S = 1e6
LINK_PRESETS: dict[str, tuple[float | None, float]] = {
    "infiniband": (45.0, 12.0),
    "roce": (23.75, 12.0),
    "nvlink": (450.0, 4.0),
    "instant": (None, 0.0),
}
"""``kind``: (GB/s per lane, one direction; None: unbounded, latency µs) (module docstring)."""
DEFAULT_RESERVED_DECODE_TOKENS = 512
"""SGLang's ``SGLANG_NUM_RESERVED_DECODE_TOKENS`` default (``disaggregation/decode.py``)."""

PoolInstances = Annotated[
    int, Range(1, MAX_POOL_INSTANCES, why="4096 instances: beyond any deployment")
]
Blocks = Annotated[int, Range(1, MAX_TOKENS, why=TOKENS_WHY)]
PositiveTokens = Annotated[int, Range(1, MAX_TOKENS, why=TOKENS_WHY)]
TP = Annotated[int, Range(1, 1024, why="it divides the heads, at most 1024")]


@dataclass(frozen=True)
class PoolCost:
    """A pool's GPU and parallelism, replacing ``admit.cost``'s (null: the run's)."""

    gpu: str | None = None
    tp: TP | None = None
    pp: TP | None = None
    ep: TP | None = None

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class PrefillPool:
    """``admit.cluster.prefill`` (module docstring)."""

    instances: PoolInstances = 1
    router: str = "round_robin"
    cost: PoolCost = field(default_factory=PoolCost)
    capacity_blocks: Blocks | None = None
    max_prefill_tokens: PositiveTokens | None = None
    chunked_prefill_size: PositiveTokens | None = None

    def validate(self) -> None:
        _check_router(self.router)


@dataclass(frozen=True)
class DecodePool:
    """``admit.cluster.decode`` (module docstring)."""

    instances: PoolInstances = 1
    router: str = "round_robin"
    cost: PoolCost = field(default_factory=PoolCost)
    capacity_blocks: Blocks | None = None
    max_running_requests: PositiveTokens | None = None
    reserved_decode_tokens: Annotated[int, Range(0, MAX_TOKENS, why=TOKENS_WHY)] = (
        DEFAULT_RESERVED_DECODE_TOKENS
    )

    def validate(self) -> None:
        _check_router(self.router)


def _check_router(name: str) -> None:
    from cpkv.serving.cluster.routers import ROUTERS

    choices("router", (name,), ROUTERS.allowed())


@dataclass(frozen=True)
class LinkSpec:
    """``admit.cluster.link`` (module docstring)."""

    kind: str = "infiniband"
    gb_per_s: (
        Annotated[
            float,
            Range(0, MAX_LINK_GB_PER_S, low_open=True, why="1 PB/s a lane, beyond any link"),
        ]
        | None
    ) = None
    latency_us: Annotated[float, Range(0, CLOCK_LIMIT_US, why=CLOCK_WHY)] | None = None

    def validate(self) -> None:
        choices("kind", (self.kind,), tuple(LINK_PRESETS))
        if self.kind == "instant":
            for key in ("gb_per_s", "latency_us"):
                if getattr(self, key) is not None:
                    raise FieldError(
                        key,
                        "kind instant takes no time (unbounded bandwidth, no latency); give "
                        "kind infiniband, roce or nvlink to set its numbers",
                    )

    def numbers(self) -> tuple[float | None, float]:
        """(GB/s per lane, None: unbounded; latency µs): the preset's, replaced where given."""
        bandwidth, latency = LINK_PRESETS[self.kind]
        if self.gb_per_s is not None:
            bandwidth = self.gb_per_s
        if self.latency_us is not None:
            latency = self.latency_us
        return bandwidth, latency


def pool_cost(base: CostSpec, pool: PrefillPool | DecodePool, key: str) -> CostSpec:
    """``admit.cost`` with the pool's ``cost`` keys replaced, validated (a FieldError names
    ``key``'s own key: ``cluster.prefill.cost.tp``)."""
    given = pool.cost.given()
    if not given:
        return base
    spec = replace(base, **given)
    try:
        spec.validate()
    except FieldError as err:
        name = err.key if err.key in given else next(iter(given))
        raise FieldError(f"{key}.cost.{name}", err.detail) from None
    return spec


def pool_gpus(spec: CostSpec) -> int:
    """The GPUs of one instance under ``spec``: ``tp x pp`` (a linear model: 1)."""
    return spec.tp * spec.pp if spec.kind == "roofline" else 1
