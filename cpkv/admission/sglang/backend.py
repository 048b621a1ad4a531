"""``admit.backend: sglang``: the same tick loop through the REAL sglang 0.5.23 PrefillAdder.

Imported only when asked for. :class:`~cpkv.admission.sglang.world.SglangWorld` builds the real
pools, radix tree (HiCache on) and requests; this module runs
``Scheduler._get_new_batch_prefill_raw``'s loop around the real ``PrefillAdder`` for a plain
model (the continuing chunk first, then the queue: stop on ``budget_state() == OTHER``, on a
full batch, or on ``add_one_req`` != ``CONTINUE``), tick by tick with the conventions of
:mod:`cpkv.admission.ticks`, and returns the model's record types. A chunk that a pass computed is
not charged to the allocator: its request's ``prefix_len`` moves to ``extend_end``.
``init_load_back`` is wrapped only to record each call as a LoadBackEvent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from cpkv.admission.budgets import AdmitBudgets
from cpkv.admission.records import (
    BATCH_FULL,
    NO_TOKEN,
    OTHER,
    QUEUE_EXHAUSTED,
    AcceptedRequest,
    AdmitResult,
    TickRecord,
    summarize,
)
from cpkv.admission.sglang.world import SglangWorld, load_sglang
from cpkv.core.errors import ConfigError
from cpkv.core.sglang_env import require_sglang
from cpkv.workload.request import Request, ceil_page

_DONE = SimpleNamespace(synchronize=lambda: None)  # a finished CPU "event"


def check_supported(budgets: AdmitBudgets) -> None:
    """UnsupportedError without sglang, ConfigError for what upstream cannot do (cheap)."""
    require_sglang("admit.backend=sglang")
    if budgets.cp.enabled:
        raise ConfigError(
            "admit.cp.enabled: the sglang backend has no CP shared-KV limits (upstream SGLang "
            "has none); set admit.cp.enabled=false, or use admit.backend=model"
        )
    if budgets.load_back_quota_tokens is not None:
        raise ConfigError(
            "admit.load_back_quota_tokens: SGLang's PrefillAdder passes no load-back quota; "
            "leave it null with admit.backend=sglang"
        )


def run_sglang(requests: Sequence[Request], budgets: AdmitBudgets) -> AdmitResult:
    """Run the tick loop on the real PrefillAdder; same records as the model."""
    check_supported(budgets)
    world = _Scheduler(load_sglang(), requests, budgets)
    ticks: list[TickRecord] = []
    while world.head < len(world.reqs) or world.chunked is not None:
        record = world.run_pass(len(ticks))
        ticks.append(record)
        if not record.accepted:
            break
        if budgets.release_each_tick:
            world.release_finished()
    return AdmitResult(tuple(ticks), summarize("sglang", len(requests), tuple(ticks)))


class _Scheduler(SglangWorld):
    """The scheduler's prefill scan around the real PrefillAdder, one pass per tick."""

    # -- one pass: Scheduler._get_new_batch_prefill_raw, plain model, FCFS -----------------
    def run_pass(self, tick: int) -> TickRecord:
        """One fresh PrefillAdder over the waiting queue (after the continuing chunk, if any)."""
        sg, b = self.sg, self.b
        t0 = time.perf_counter_ns()
        add_result = sg.schedule_policy.AddReqResult
        adder = sg.schedule_policy.PrefillAdder(
            self.page, self.tree, self.alloc, self.running, float(b.new_token_ratio),
            b.max_prefill_tokens, b.chunk_tokens, 0, 0,
            max_running_requests=b.max_running_requests,
            prefill_max_requests=b.prefill_max_requests,
        )  # fmt: skip
        self.events = []
        decisions, continuing = 0, self.chunked
        if continuing is not None:
            decisions = 1
            continuing.init_next_round_input()
            self.chunked = adder.add_chunked_req(continuing)
        cap, q = b.batch_capacity(), self.head
        result = where = QUEUE_EXHAUSTED
        budget = None
        while q < len(self.reqs):
            if adder.budget_state() == add_result.OTHER:
                result, where = OTHER, "scan_top"
                budget = "rem_input_tokens" if adder.rem_input_tokens <= 0 else "rem_chunk_tokens"
                break
            if cap is not None and len(adder.can_run_list) >= cap:
                result = where = BATCH_FULL
                budget = "max_running_requests"
                break
            req = self.reqs[q]
            req.init_next_round_input(self.tree)
            decisions += 1
            res = adder.add_one_req(
                req, has_chunked_req=self.chunked is not None, truncation_align_size=None
            )
            admitted = bool(adder.can_run_list) and adder.can_run_list[-1] is req
            q += admitted
            if res != add_result.CONTINUE:
                result, where = res.name, "after_admit" if admitted else "refused"
                budget = (
                    self._state_budget(adder) if admitted else self._refusal_budget(adder, res.name)
                )
                break
        self.head = q
        accepted = tuple(self._accepted(adder, continuing))
        self.finished = [
            r for r, a in zip(adder.can_run_list, accepted, strict=True) if not a.chunked
        ]
        if adder.new_chunked_req is not None:
            self.chunked = adder.new_chunked_req
        if self.chunked is not None:  # its chunk ran: the next one starts at extend_end
            self.chunked.prefix_len = self.chunked.extend_end
        return TickRecord(
            tick=tick,
            accepted=accepted,
            stopped_on_rid=self.reqs[q].rid if q < len(self.reqs) else None,
            stopped_result=result,
            stopped_budget=budget,
            stopped_where=where,
            log_hit_tokens=adder.log_hit_tokens,
            log_input_tokens=adder.log_input_tokens,
            cp_total_extend_tokens=sum(ceil_page(a.extend_tokens, self.page) for a in accepted),
            cp_total_cached_tokens=sum(ceil_page(a.prefix_tokens, self.page) for a in accepted),
            cp_batch_requests=len(accepted),
            allocator_available_after_tick=self.alloc.available_size(),
            evictable_after_tick=self.tree.evictable_size(),
            load_back_events=tuple(self.events),
            rem_total_tokens=adder.rem_total_tokens,
            cur_rem_tokens=adder.cur_rem_tokens,
            rem_input_tokens=adder.rem_input_tokens,
            rem_chunk_tokens=adder.rem_chunk_tokens,
            decisions=decisions,
            duration_us=(time.perf_counter_ns() - t0) / 1000.0,
        )

    def _accepted(self, adder: Any, continuing: Any) -> list[AcceptedRequest]:
        out = []
        for r in adder.can_run_list:
            if r is continuing:
                out.append(
                    AcceptedRequest(r.rid, r.prefix_len, r.extend_len, self.chunked is r, True)
                )
            else:
                chunked = r is adder.new_chunked_req
                out.append(
                    AcceptedRequest(
                        r.rid, r.prefix_len, r.extend_len, chunked, False,
                        r.host_hit_length, r.host_loaded_length,
                    )
                )  # fmt: skip
        return out

    def _refusal_budget(self, adder: Any, result: str) -> str:
        """Which check refused the candidate (the only ones that can, for a plain model)."""
        if result == NO_TOKEN:
            return "rem_total_tokens"
        limit = self.b.prefill_max_requests
        if limit is not None and len(adder.can_run_list) >= limit:
            return "prefill_max_requests"
        return "rem_input_tokens" if self.b.chunk_tokens is None else "rem_chunk_tokens"

    @staticmethod
    def _state_budget(adder: Any) -> str:
        """Which budget made ``budget_state()`` stop after an admission."""
        if adder.rem_total_tokens <= 0:
            return "rem_total_tokens"
        if adder.cur_rem_tokens <= 0:
            return "cur_rem_tokens"
        return "rem_input_tokens" if adder.rem_input_tokens <= 0 else "rem_chunk_tokens"

    def release_finished(self) -> None:
        """Requests whose prompt finished drop their locks; pending loads are acknowledged."""
        tree, cc = self.tree, self.tree.cache_controller
        if tree.ongoing_load_back:  # the H2D copies (never run on CPU) are acknowledged
            cc.load_queue.clear()
            cc.ack_load_queue.append(
                SimpleNamespace(
                    finish_event=_DONE, node_ids=list(tree.ongoing_load_back), num_bytes=0,
                    num_tokens_by_pool=None, timing_enabled=False,
                )
            )  # fmt: skip
            tree.loading_check(finish_count=1)
        for r in self.finished:
            tree.unlock(r.lock)
            r.lock = None
