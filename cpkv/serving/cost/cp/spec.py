"""``admit.cost.cp``: context-parallel (CP) shared-KV prefill on ``size`` ranks, how they
exchange KV, and the constants of a batch's cached-token work (:mod:`.work` says where each
comes from).

* ``size``: the CP ranks (1, the default: no CP, the roofline model unchanged). Each rank is
  one deployment of ``admit.cost`` (``tp`` GPUs holding the model), so the CP prefill runs on
  ``size × tp`` GPUs;
* ``kv_exchange``: ``all_gather`` (the default: every rank gathers the batch's extend KV
  before its attention, on the critical path: SGLang's in-sequence-split prefill CP and
  vLLM's prefill CP gather the keys and values) or ``ring`` (ring attention: the KV passes
  around the ranks while each attends to the block it holds; only the transfer the layer's
  attention does not cover is waited for);
* ``page_size``: the tokens of a page of the shared paged L1 pool (the owner lanes'
  granularity, seed 003's default 64);
* ``descriptor_page_us``, ``descriptor_fixed_us``: the engine's CPU time to build a CP
  prefill batch's page descriptors, per page of the batch's tokens and per batch;
* ``load_back_page_us``: the time per page each rank spends issuing its L2 -> L1 load-back
  copies, beside their bytes;
* ``topk_passes``: how many times the sparse-attention top-k reads each query's index scores;
* ``l1_pages_per_rank``: the pages of each rank's owner lane in the shared paged L1 pool
  (null, the default: the pool is ``admit.kv`` as given). Given, it sizes the serving pool
  (cpkv's loop): ``l1_pages_per_rank`` stripes of ``size × page_size`` tokens, because
  round-robin owners put a request's pages ``0, size, 2·size, …`` on lane 0, the fullest
  (:func:`.layout.lane_pool`); ``admit.kv``'s pool is then left out (or given as the same
  pool).

Every key but ``size`` applies only with ``size`` > 1; set with ``size`` 1 it is refused (it
would be ignored). ``size`` > 1 needs ``pp`` 1 (a CP rank is a whole model).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated

from cpkv.core.schema import FieldError, Range, choices
from cpkv.serving.cost.cpu import CpuUs

KV_EXCHANGES = ("all_gather", "ring")
PageSize = Annotated[
    int, Range(1, 1 << 16, why="65,536 tokens: 64x the largest page an engine uses, 1024")
]
CpSize = Annotated[int, Range(1, 1024, why="1024 ranks: 8x the largest published CP group")]
Passes = Annotated[int, Range(0, 64, why="a radix select reads its input a few times")]
LanePages = Annotated[int, Range(1, 1 << 40, why="2^40 pages: beyond any device's memory")]
PageUs = Annotated[float, Range(0, 1e6, why="1 s a page")]


@dataclass(frozen=True)
class CpSpec:
    """``admit.cost.cp`` (module docstring); defaults: :mod:`.work`'s constants."""

    size: CpSize = 1
    kv_exchange: str = "all_gather"
    page_size: PageSize = 64
    descriptor_page_us: PageUs = 1.25
    descriptor_fixed_us: CpuUs = 50.0
    load_back_page_us: PageUs = 1.0
    topk_passes: Passes = 2
    l1_pages_per_rank: LanePages | None = None

    def validate(self) -> None:
        choices("kv_exchange", (self.kv_exchange,), KV_EXCHANGES)
        if self.size == 1:
            default = CpSpec()
            for f in fields(self):
                if f.name != "size" and getattr(self, f.name) != getattr(default, f.name):
                    raise FieldError(
                        f.name, "applies only to a CP prefill (size > 1), and size is 1; "
                        "set size, or leave the key out",
                    )  # fmt: skip
