"""The REAL sglang 0.5.23 ``SchedulePolicy`` and ``PrefillAdder.preempt_to_schedule`` on CPU.

Builds what the scheduler builds for a plain FULL-attention model with HiCache on (the
default ``UnifiedRadixCache`` and its default Rust tree core, host pool on plain memory as in
:mod:`cpkv.admission.sglang.world`), fills it from a scenario (host sequences inserted, backed
up and evicted from the device, then the device prefixes inserted again), makes real ``Req``
objects and runs the real code. ``ServerArgs`` carrying the scenario's priority flags are
published for the scheduler code (``preempt_to_schedule`` reads them); the admission
backend's cached arguments are dropped afterwards so that it publishes its own again.
"""

from __future__ import annotations

import random
from array import array
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from cpkv.admission.sglang import world as sglang_world
from tests.helpers.schedule_scenarios import (
    CachedSeq,
    OrderScenario,
    PreemptScenario,
    WaitSpec,
    cached_ids,
    output_ids,
    prompt_ids,
)


def sg() -> SimpleNamespace:
    return sglang_world.load_sglang()


_ARGS: dict[tuple, Any] = {}
_PUBLISHED: list[Any] = [None]


def publish_args(page: int, low_first: bool, priority: bool) -> None:
    """Publish ServerArgs with these flags (the admission backend republishes its own)."""
    s = sg()
    key = (page, low_first, priority)
    args = _ARGS.get(key)
    if args is None:
        args = s.server_args.ServerArgs(
            model_path="dummy", page_size=page, enable_hierarchical_cache=True,
            hicache_io_backend="direct", hicache_ratio=2.0, hicache_write_policy="write_through",
            hicache_mem_layout="layer_first", enable_priority_scheduling=priority,
            schedule_low_priority_values_first=low_first,
        )  # fmt: skip
        _ARGS[key] = args
    s.server_args.set_global_server_args_for_scheduler(args)
    _PUBLISHED[0] = args
    sglang_world._SG.pop("args_key", None)  # the admission backend must publish again


class RealCache:
    """Pools and a HiCache ``UnifiedRadixCache`` holding a scenario's cached sequences."""

    def __init__(self, page: int, block: int, cached: list[CachedSeq], device: list[tuple[int, int]],
                 kv_tokens: int | None = None, disable: bool = False) -> None:  # fmt: skip
        s = sg()
        self.page = page
        torch = s.torch
        hosted = sum(c.tokens for c in cached) + page
        kv = kv_tokens if kv_tokens is not None else max(hosted, 64)
        kv = -(-kv // page) * page + page
        rows = s.memory_pool.ReqToTokenPool(
            size=8, max_context_len=16, device="cpu", enable_memory_saver=False
        )
        pool = s.memory_pool.MHATokenToKVPool(
            size=kv, page_size=page, dtype=torch.bfloat16, head_num=1, head_dim=1,
            layer_num=1, device="cpu", enable_memory_saver=False,
        )  # fmt: skip
        common = {"size": kv, "dtype": torch.bfloat16, "device": "cpu", "kvcache": pool,
                  "need_sort": False}  # fmt: skip
        if page == 1:
            self.alloc = s.allocator.TokenToKVPoolAllocator(**common)
        else:
            self.alloc = s.paged.PagedTokenToKVPoolAllocator(page_size=page, **common)
        params = s.cache_init_params.CacheInitParams(
            disable=disable, req_to_token_pool=rows, token_to_kv_pool_allocator=self.alloc,
            page_size=page, tree_components=(s.base.ComponentType.FULL,),
        )  # fmt: skip
        self.tree = s.unified_radix_cache.UnifiedRadixCache(params)
        if disable:
            return
        self.tree.init_hicache(_PUBLISHED[0], params)  # host pool: 2x the device pool
        self.tree.write_through_threshold = 1 << 60
        self.host_pool = self.tree.cache_controller.mem_pool_host
        seqs = [array("q", cached_ids(c, block)) for c in cached]
        for tokens in seqs:
            if tokens:
                self.insert(tokens)
                self.backup(tokens)
        self.tree.evict(s.base_prefix_cache.EvictParams(num_tokens=1 << 50))
        for index, n in device:
            self.insert(seqs[index][:n])

    def insert(self, tokens: array) -> None:
        s = sg()
        value = self.alloc.alloc(len(tokens))
        assert value is not None, "oracle setup: KV pool too small"
        key = s.radix_cache.RadixKey(tokens)
        self.tree.insert(s.base_prefix_cache.InsertParams(key=key, value=value))

    def backup(self, tokens: array) -> None:
        s, core = sg(), self.tree.tree_core
        key = s.radix_cache.RadixKey(tokens)
        node = self.tree.match_prefix(
            s.base_prefix_cache.MatchPrefixParams(key=key)
        ).last_device_node
        for node_id in core.build_backup_kv_action(node).node_ids:
            if not self.tree.is_backuped(node_id):
                device_values, components = core.build_backup_spec(node_id)
                core.commit_backup(node_id, self.host_pool.alloc(len(device_values)), components)


def make_req(w: WaitSpec, block: int, priority: int | None) -> Any:
    s = sg()
    params = s.sampling_params.SamplingParams(temperature=0, max_new_tokens=w.max_new_tokens)
    params.normalize(None)
    req = s.schedule_batch.Req(
        rid=w.rid, origin_input_text="", origin_input_ids=array("q", prompt_ids(w, block)),
        sampling_params=params, priority=priority,
    )  # fmt: skip
    req.output_ids = array("q", output_ids(w))
    req.time_stats.wait_queue_entry_time = w.queue_entry
    req.arrival_processed_tokens = w.arrival_processed
    return req


def resolve(priority: int | None, on: bool, low_first: bool) -> int | None:
    """The scheduler's ``_set_or_validate_priority`` (run at enqueue)."""
    if on and priority is None:
        return (1 << 63) - 1 if low_first else -(1 << 63)
    return priority


@contextmanager
def in_batch_thresholds(check: int, deprioritize: int):
    mod = sg().schedule_policy
    saved = (
        mod.IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD,
        mod.IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD,
    )
    mod.IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = check
    mod.IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = deprioritize
    try:
        yield
    finally:
        (
            mod.IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD,
            mod.IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD,
        ) = saved


def real_orders(s: OrderScenario, disable: bool = False) -> list[list[str]]:
    """The rids in the order the real calc_priority leaves them, after each pass."""
    publish_args(s.page_size, s.low_first, s.priority_on)
    cache = RealCache(s.page_size, s.block_size, s.cached, s.device, disable=disable)
    policy = sg().schedule_policy.SchedulePolicy(
        s.policy, cache.tree, True, s.priority_on, s.low_first
    )
    random.seed(s.seed)
    queue: list[Any] = []
    out = []
    with in_batch_thresholds(s.check_threshold, s.deprioritize_threshold):
        for arrivals, processed in s.passes:
            queue.extend(
                make_req(w, s.block_size, resolve(w.priority, s.priority_on, s.low_first))
                for w in arrivals
            )
            policy.calc_priority(queue, None, processed_tokens=processed)
            out.append([r.rid for r in queue])
    return out


# -- preemption ----------------------------------------------------------------------------


class _Batch:
    """The running batch's two calls preempt_to_schedule makes, recorded (the requests
    hold no KV here: nothing to free)."""

    def __init__(self, reqs: list[Any]) -> None:
        self.reqs = reqs
        self.released: list[int] = []
        self.kept: list[int] | None = None

    def release_req(self, idx: int, remaining: int) -> bool:
        self.released.append(idx)
        return True

    def filter_batch(self, keep_indices: list[int]) -> None:
        self.kept = list(keep_indices)
        self.reqs = [self.reqs[i] for i in keep_indices]

    def is_empty(self) -> bool:
        return not self.reqs

    def batch_size(self) -> int:
        return len(self.reqs)


def real_preemption(p: PreemptScenario) -> dict[str, Any]:
    """Run the real preempt_to_schedule once; what it decided and what the model needs."""
    s = sg()
    publish_args(p.page_size, p.low_first, True)
    cand = p.candidate
    cached = [CachedSeq(None, cand.uid, p.candidate_cached)] if p.candidate_cached else []
    cache = RealCache(
        p.page_size,
        1,
        cached,
        [(0, p.candidate_cached)] if cached else [],
        kv_tokens=p.available_tokens + p.candidate_cached + p.page_size,
    )
    burn = cache.alloc.available_size() - p.available_tokens
    if burn > 0:
        cache.alloc.alloc(burn)
    running = []
    for k, r in enumerate(p.running):
        w = WaitSpec(20_000 + k, f"run{k}", None, 4, r.output_tokens, r.max_new_tokens,
                     r.priority, r.queue_entry, 0)  # fmt: skip
        req = make_req(w, 1, r.priority)
        req.sampling_params.ignore_eos = r.ignore_eos
        if r.finished:
            req.finished_reason = s.schedule_batch.FINISH_LENGTH(length=r.max_new_tokens)
        running.append(req)
    batch = _Batch(running)
    adder = s.schedule_policy.PrefillAdder(
        p.page_size, cache.tree, cache.alloc, batch, p.ratio, 1 << 20, None,
        priority_scheduling_preemption_threshold=p.threshold,
    )  # fmt: skip
    req = make_req(cand, 1, cand.priority)
    if p.candidate_state != "fresh":
        req.init_next_round_input(cache.tree)
        if p.candidate_state == "retracted":
            req.reset_for_retract()
    seen = (len(req.full_untruncated_fill_ids), req.prefix_len)
    rem, offset_before = adder.rem_total_tokens, adder.memory_budget.total_offset
    ok = adder.preempt_to_schedule(req)
    return {
        "ok": ok,
        "released": batch.released,
        "kept": batch.kept,
        "preempted": sorted(r.rid for r in adder.preempt_list),
        "rem_total": rem,
        "offset_before": offset_before,
        "offset_after": adder.memory_budget.total_offset,
        "seen_fill_prefix": seen,
    }
