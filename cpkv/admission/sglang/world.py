"""The real sglang objects for :mod:`cpkv.admission.sglang.backend`, built once per run.

Imported only when ``admit.backend: sglang`` is asked for. It builds, on CPU, what SGLang's
scheduler builds for a plain FULL-attention model: ``ServerArgs`` (published for the
scheduler), ``ReqToTokenPool``, a one-layer ``MHATokenToKVPool``, ``TokenToKVPoolAllocator``
(page 1) or ``PagedTokenToKVPoolAllocator``, the default ``UnifiedRadixCache`` with HiCache on
(host pool on plain CPU memory: bookkeeping only, no KV bytes move), real ``Req`` /
``SamplingParams``, and light stand-ins for the running decodes (the adder reads only their
``max_new_tokens``, ``ignore_eos`` and output length).

Setup, in this order: every request's ``floor_page(l1 + l2)`` tokens (fresh token ids per
request) are inserted, backed up to the host pool and evicted from the device, so they are
L2-only; then the other evictable cache (one node of ``evictable_tokens``) and each request's
``floor_page(l1)`` prefix, in queue order, are inserted on the device, unlocked (so the LRU
order is: other cache, then the prefixes in queue order; every L1 prefix also has its L2
copy); then slots are taken from the allocator so that exactly ``available_tokens`` stay free.
The ``ReqToTokenPool`` is tiny: no request row is ever allocated (``max_running_requests``
is applied by the scan loop, as the scheduler's ``get_num_allocatable_reqs`` would with
enough rows).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from cpkv.admission.budgets import AdmitBudgets
from cpkv.admission.records import LoadBackEvent
from cpkv.core.sglang_env import import_sglang_module
from cpkv.workload.request import Request, ceil_page, device_and_host_hit

_SG: dict[str, Any] = {}


def load_sglang() -> SimpleNamespace:
    """The sglang names this backend uses (imported once per process)."""
    if not _SG:
        torch = import_sglang_module("torch")
        mods = {
            m: import_sglang_module(f"sglang.srt.{m}")
            for m in (
                "managers.schedule_batch", "managers.schedule_policy", "mem_cache.allocator",
                "mem_cache.allocator.paged", "mem_cache.base_prefix_cache",
                "mem_cache.cache_init_params", "mem_cache.memory_pool", "mem_cache.radix_cache",
                "mem_cache.unified_cache.components.base", "mem_cache.unified_radix_cache",
                "sampling.sampling_params", "server_args", "mem_cache.pool_host.common",
            )
        }  # fmt: skip
        # HiCache's host buffer is page-locked with cudaHostRegister; plain memory here.
        mods["mem_cache.pool_host.common"].ALLOC_MEMORY_FUNCS["cpu"] = (
            lambda dims, dtype, device, pin_memory, allocator, **_: torch.zeros(dims, dtype=dtype)
        )
        _SG["ns"] = SimpleNamespace(torch=torch, **{k.split(".")[-1]: v for k, v in mods.items()})
    return _SG["ns"]


def server_args(sg: SimpleNamespace, page: int, host_ratio: float) -> Any:
    """ServerArgs for a page size and host-pool ratio, published for the scheduler code.

    Building and publishing them is most of a small run's setup, so the last ones are reused
    while the page size and ratio stay the same.
    """
    key = (page, host_ratio)
    if _SG.get("args_key") != key:
        args = sg.server_args.ServerArgs(
            model_path="dummy", page_size=page, enable_hierarchical_cache=True,
            hicache_io_backend="direct", hicache_ratio=host_ratio,
            hicache_write_policy="write_through", hicache_mem_layout="layer_first",
        )  # fmt: skip
        sg.server_args.set_global_server_args_for_scheduler(args)
        _SG["args_key"], _SG["args"] = key, args
    return _SG["args"]


class SglangWorld:
    """The real pools, radix tree (HiCache on), requests and running stand-ins of one run."""

    def __init__(self, sg: SimpleNamespace, requests: Sequence[Request], b: AdmitBudgets) -> None:
        self.sg, self.b, self.page = sg, b, b.page_size
        page = b.page_size
        hits = [device_and_host_hit(r, page) for r in requests]
        resident = b.other_evictable_tokens() + sum(d for d, _ in hits)
        hosted = sum(d + h for d, h in hits)
        kv = ceil_page(max(b.allocator_tokens() + resident, hosted, page), page)
        self._build_pools(kv, float(max(2, -(-hosted // kv) + 1)))
        next_id = 1
        ids = []
        for r in requests:
            ids.append(array("q", range(next_id, next_id + r.fill_tokens)))
            next_id += r.fill_tokens
        for (d, h), tokens in zip(hits, ids, strict=True):
            if d + h:
                self._insert(tokens[: d + h])
                self._backup(tokens[: d + h])
        self.tree.evict(sg.base_prefix_cache.EvictParams(num_tokens=1 << 50))
        if b.other_evictable_tokens():
            n = b.other_evictable_tokens()
            self._insert(array("q", range(next_id, next_id + n)))
        for (d, _), tokens in zip(hits, ids, strict=True):
            if d:
                self._insert(tokens[:d])
        burn = self.alloc.available_size() - b.allocator_tokens()
        self._burnt = self.alloc.alloc(burn) if burn else None  # held for the whole run
        if (self.alloc.available_size(), self.tree.evictable_size()) != (
            b.allocator_tokens(),
            resident,
        ):
            raise RuntimeError(
                f"sglang setup: free {self.alloc.available_size()} / evictable "
                f"{self.tree.evictable_size()}, expected {b.allocator_tokens()} / {resident}"
            )
        self.reqs = [self._make_req(r, tokens) for r, tokens in zip(requests, ids, strict=True)]
        self.running = self._running_stand_ins()
        self.head, self.chunked, self.finished = 0, None, []
        self.events: list[LoadBackEvent] = []
        self._trace_load_back()

    # -- setup ---------------------------------------------------------------------------
    def _build_pools(self, kv: int, host_ratio: float) -> None:
        sg, page = self.sg, self.page
        args = server_args(sg, page, host_ratio)
        torch = sg.torch
        rows = sg.memory_pool.ReqToTokenPool(
            size=8, max_context_len=16, device="cpu", enable_memory_saver=False
        )
        pool = sg.memory_pool.MHATokenToKVPool(
            size=kv, page_size=page, dtype=torch.bfloat16, head_num=1, head_dim=1,
            layer_num=1, device="cpu", enable_memory_saver=False,
        )  # fmt: skip
        common = {
            "size": kv,
            "dtype": torch.bfloat16,
            "device": "cpu",
            "kvcache": pool,
            "need_sort": False,
        }
        if page == 1:
            self.alloc = sg.allocator.TokenToKVPoolAllocator(**common)
        else:
            self.alloc = sg.paged.PagedTokenToKVPoolAllocator(page_size=page, **common)
        params = sg.cache_init_params.CacheInitParams(
            disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=self.alloc,
            page_size=page, tree_components=(sg.base.ComponentType.FULL,),
        )  # fmt: skip
        self.tree = sg.unified_radix_cache.UnifiedRadixCache(params)
        self.tree.init_hicache(args, params)
        self.tree.load_back_threshold = self.b.load_back_threshold
        self.tree.write_through_threshold = 1 << 60  # no backups triggered by hits
        self.host_pool = self.tree.cache_controller.mem_pool_host

    def _insert(self, tokens: array) -> None:
        sg = self.sg
        value = self.alloc.alloc(len(tokens))
        key = sg.radix_cache.RadixKey(tokens)
        self.tree.insert(sg.base_prefix_cache.InsertParams(key=key, value=value))

    def _backup(self, tokens: array) -> None:
        """Commit a host copy of the device path holding ``tokens`` (bookkeeping only)."""
        sg, core = self.sg, self.tree.tree_core
        key = sg.radix_cache.RadixKey(tokens)
        node = self.tree.match_prefix(
            sg.base_prefix_cache.MatchPrefixParams(key=key)
        ).last_device_node
        for node_id in core.build_backup_kv_action(node).node_ids:
            if not self.tree.is_backuped(node_id):
                device_values, components = core.build_backup_spec(node_id)
                core.commit_backup(node_id, self.host_pool.alloc(len(device_values)), components)

    def _make_req(self, r: Request, tokens: array) -> Any:
        sg = self.sg
        mx = self.b.max_new_tokens if r.max_new_tokens is None else r.max_new_tokens
        params = sg.sampling_params.SamplingParams(temperature=0, max_new_tokens=mx)
        params.normalize(None)
        return sg.schedule_batch.Req(
            rid=r.rid, origin_input_text="", origin_input_ids=tokens, sampling_params=params
        )

    def _running_stand_ins(self) -> SimpleNamespace:
        reqs = [
            SimpleNamespace(
                rid=f"running{k}",
                sampling_params=SimpleNamespace(
                    max_new_tokens=d.max_new_tokens, ignore_eos=d.ignore_eos
                ),
                output_ids=[0] * d.output_len,
            )
            for k, d in enumerate(self.b.running)
        ]
        return SimpleNamespace(reqs=reqs, batch_size=lambda: len(reqs), is_empty=lambda: not reqs)

    def _trace_load_back(self) -> None:
        """Record every ``init_load_back`` call as a LoadBackEvent (the call itself is real)."""
        real, alloc, thr = self.tree.init_load_back, self.alloc, max(1, self.b.load_back_threshold)

        def traced(params: Any) -> Any:
            before = alloc.available_size()
            out = real(params)
            after = alloc.available_size()
            loaded = out[0] if out else 0
            want = params.host_hit_length
            outcome = "loaded" if loaded else ("below_threshold" if want < thr else "no_room")
            self.events.append(
                LoadBackEvent(
                    params.req.rid, want, ceil_page(want, self.page), loaded, None,
                    before, after, after - before + loaded, outcome,
                )
            )  # fmt: skip
            return out

        self.tree.init_load_back = traced
