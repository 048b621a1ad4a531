"""A model of SGLang 0.5.23's PrefillAdder and scan loop, with HiCache load-back and CP limits.

One call of :meth:`PrefillAdderModel.run_pass` is one ``Scheduler._get_new_batch_prefill_raw``
pass (plain FULL-attention model, FCFS, no mixed chunk, no priority preemption):

1. ``add_chunked_req`` for a request cut in an earlier pass: ``n = min(L - prefix, lim)``
   with ``lim = min(rem_chunk, int(rem_total))``, or ``rem_chunk`` when that is ``<= 0``;
2. the scan: stop on ``budget_state() == OTHER`` (first step only: later steps just saw
   ``CONTINUE``), stop when the batch is full (``max_running_requests``), else
   ``add_one_req`` and stop on anything but ``CONTINUE``.

``add_one_req`` checks, in SGLang's order: ``prefill_max_requests`` (OTHER); memory,
``(L - D) + min(max_new, 4096) + page < rem_total`` under a temporary lock on the candidate's
own L1 prefix (else NO_TOKEN); without chunking, ``ceil_page(E) >= rem_input`` once the
batch is not empty (OTHER); with chunking, ``ceil_page(E) > rem_chunk`` cuts the request to
``floor_page(P + floor_page(rem_chunk)) - P`` tokens (OTHER when that is 0). Then, cpkv's
own step, the CP shared-KV limits (OTHER, see below). Then the L2 load-back (all or nothing;
when declined the selection is redone with no host hit, CP limits included), the commit
(lock, reservations) and ``budget_state()``, whose verdict stops the scan but keeps the
request.

Memory is ``rem_total = available + evictable - total_offset`` and ``cur_rem = available +
evictable - current_offset``, evaluated live. ``evictable`` is the other unlocked cache
(``evictable_tokens``) plus the L1 prefixes of every request still waiting, minus the
candidate's own prefix while it is evaluated: in SGLang those prefixes sit unlocked in the
radix tree until their request is admitted and locks them.

CP shared-KV limits (not in upstream SGLang): when ``cp.enabled`` and the batch already holds
a request, a candidate whose admission would make ``cp_batch_requests > max_batch_requests``,
``sum(ceil_page(E)) > max_total_extend_tokens`` or ``sum(ceil_page(P)) >
max_total_cached_tokens`` stops the scan with OTHER (checked in that order, after the
selection, so a cut request counts its cut ``E``, and before the load-back, so a stopped
request loads nothing). A continuing chunk counts its chunk as ``E`` and the tokens before it
as ``P``. A request alone in the batch is never stopped by a CP limit.

Load-back of an L2 hit ``H`` (SGLang ``init_load_back``, in
:class:`~cpkv.admission.state.AdmissionState`): declined when ``H <
max(1, load_back_threshold)`` or above ``load_back_quota_tokens``; when fewer than ``H``
slots are free, unlocked L1 nodes are evicted (LRU, whole nodes) until enough are, declined
if they still are not. Success takes ``H`` slots at once; the request then computes only
``E`` tokens.
"""

from __future__ import annotations

import time

from cpkv.admission.cp_limit import cp_limit_broken
from cpkv.admission.records import (
    BATCH_FULL,
    NO_TOKEN,
    OTHER,
    QUEUE_EXHAUSTED,
    AcceptedRequest,
    TickRecord,
    new_accepted,
    new_load_back_event,
    new_tick,
)
from cpkv.admission.state import AdmissionState
from cpkv.workload.request import ceil_page, floor_page


class PrefillAdderModel(AdmissionState):
    """SGLang's scheduling pass (add_chunked_req, the scan, add_one_req) over the state."""

    __slots__ = ()

    # -- one pass ------------------------------------------------------------------------
    def run_pass(self, tick: int) -> TickRecord:
        """One scheduling pass. The hot path keeps every budget in a local int and leaves
        only the rare cases (eviction, declined load-back, CP limits hit) to methods.

        ``room`` is SGLang's ``available_size() + evictable_size()``; SGLang's budgets are
        ``rem_total = room - total_offset`` and ``cur_rem = room - current_offset``.
        Running sums: ``extend_paged_sum`` (page-aligned extend tokens, continuing chunk
        included), ``current_offset``, ``total_offset``, ``cached_paged_sum`` (page-aligned
        prefix tokens), ``log_input_tokens``. SGLang's ``rem_input_tokens`` is
        ``max_prefill_tokens - extend_paged_sum``, ``rem_chunk_tokens`` is ``chunk_tokens -
        extend_paged_sum`` and ``log_hit_tokens`` is ``cached_paged_sum`` less the continuing
        chunk's prefix: they are derived, not tracked. So is ``decisions`` (the scanned
        requests, plus the chunk and a refused candidate).

        Page rounding is :func:`~cpkv.workload.request.ceil_page`, written inline
        (``-(-x // page) * page``) only where it runs once per candidate: a call there costs
        about 5 % of the pass on the admission benchmark.

        The serving engine's pass (:func:`cpkv.serving.schedulers.adder_pass.adder_pass`) applies the same
        rules but cannot share this loop: it has no evictable cache (waiting prefixes, LRU
        eviction on load-back), starts from a mixed batch's decode offsets, pulls candidates
        lazily from the live prefix cache and records no per-tick events; both are hot loops
        where a shared per-candidate call would cost what it saves. The rare CP check is
        shared (:func:`cpkv.admission.cp_limit.cp_limit_broken`)."""
        start_ns = time.perf_counter_ns()
        page = self.page_size
        fill_tokens, device_prefix, host_hit = self.fill_tokens, self.device_prefix, self.host_hit
        max_new_tokens, rids = self.max_new_tokens, self.rids
        total_offset = self.running_offset
        max_prefill, chunk_tokens = self.max_prefill_tokens, self.chunk_tokens
        chunking = chunk_tokens is not None
        accepted: list[AcceptedRequest] = []
        self.events = events = []
        self.finished = finished = []
        batch_requests = log_input_tokens = extend_paged_sum = cached_paged_sum = 0
        current_offset = chunk_cached_paged = chunk_decision = 0
        room = self.room
        if self.chunk_index >= 0:  # add_chunked_req (chunking is on)
            chunk_decision = 1
            self.n_continuations += 1
            index, prefix = self.chunk_index, self.chunk_prefix
            chunk_limit = min(chunk_tokens, int(room - total_offset))
            if chunk_limit <= 0:
                chunk_limit = chunk_tokens
            tokens_left = fill_tokens[index] - prefix
            cut = tokens_left > chunk_limit
            extend = chunk_limit if cut else tokens_left
            extend_paged = ceil_page(extend, page)
            total_offset += extend_paged + page + (0 if cut else max_new_tokens[index])
            current_offset = extend_paged + page
            log_input_tokens = extend
            extend_paged_sum = extend_paged
            cached_paged_sum = chunk_cached_paged = ceil_page(prefix, page)
            batch_requests = 1
            accepted.append(new_accepted(rids[index], prefix, extend, cut, True, 0, 0))
            if cut:
                self.chunk_prefix = prefix + extend
            else:
                self.chunk_index = -1
                if self.release_each_tick:
                    finished.append((index, *self.admitted.pop(index)))
        first = pos = self.head
        end = self.n_requests
        # a refusal sets `where` to its result (NO_TOKEN / OTHER); mapped to "refused" below
        where, budget = QUEUE_EXHAUSTED, None
        if pos < end and room - total_offset > 0 and room - current_offset > 0:
            # budget_state() at the top of the scan
            if extend_paged_sum >= max_prefill:
                where, budget = "scan_top", "rem_input_tokens"
            elif chunking and extend_paged_sum >= chunk_tokens:
                where, budget = "scan_top", "rem_chunk_tokens"
        max_running, prefill_max_requests = self.max_running, self.prefill_max_requests
        batch_limit = min(max_running, prefill_max_requests)
        input_stop = min(max_prefill, chunk_tokens) if chunking else max_prefill
        cp_on, cp_max_requests = self.cp_on, self.cp_max_requests
        cp_max_extend, cp_max_cached = self.cp_max_extend_tokens, self.cp_max_cached_tokens
        load_threshold, load_quota = self.load_back_threshold, self.load_back_quota
        release, free_slots = self.release_each_tick, self.free_slots
        stamp0 = self.evaluations + chunk_decision + 1 - first  # request i's stamp: stamp0 + i
        quick_loads = quick_loaded = 0  # load-backs that needed no eviction (counted below)
        while budget is None and pos < end:
            if batch_requests >= batch_limit:
                if batch_requests >= max_running:
                    where, budget = BATCH_FULL, "max_running_requests"
                else:
                    where, budget = OTHER, "prefill_max_requests"
                break
            device = device_prefix[pos]
            fill = fill_tokens[pos]
            max_new = max_new_tokens[pos]
            # memory: (L - D) + min(max_new, 4096) + page < rem_total, own prefix locked
            if not fill - device + max_new + page < room - device - total_offset:
                where, budget = NO_TOKEN, "rem_total_tokens"
                break
            host = host_hit[pos]
            prefix = device + host  # page aligned: both come from whole-page radix matches
            extend = fill - prefix
            extend_paged = -(-extend // page) * page
            cut = False
            if not chunking:
                if batch_requests and extend_paged_sum + extend_paged >= max_prefill:
                    where, budget = OTHER, "rem_input_tokens"
                    break
            elif extend_paged_sum + extend_paged > chunk_tokens:
                extend_paged = extend = (chunk_tokens - extend_paged_sum) // page * page
                if extend <= 0:
                    where, budget = OTHER, "rem_chunk_tokens"
                    break
                cut = True
            if (
                cp_on
                and batch_requests
                and (
                    batch_requests >= cp_max_requests
                    or extend_paged_sum + extend_paged > cp_max_extend
                    or cached_paged_sum + prefix > cp_max_cached
                )
            ):
                where, budget = (
                    OTHER,
                    self._cp_stop(
                        batch_requests, extend_paged_sum, cached_paged_sum, prefix, extend
                    ),
                )
                break
            loaded = 0
            if host:
                if host >= load_threshold and load_quota is None and free_slots >= host:
                    # loads without eviction
                    events.append(
                        new_load_back_event(
                            rids[pos], host, host, host, None, free_slots, free_slots - host,
                            0, "loaded",
                        )
                    )  # fmt: skip
                    free_slots -= host
                    room -= host
                    loaded = host
                    quick_loads += 1
                    quick_loaded += host
                else:
                    loaded, free_slots = self._load_back(pos, host, free_slots)
                    if loaded:
                        room -= loaded
                    else:  # declined: select again with no host hit
                        prefix, extend, cut, where, budget = self._reselect(
                            pos, batch_requests, max_prefill - extend_paged_sum,
                            chunk_tokens - extend_paged_sum if chunking else None,
                            room - device - total_offset, extend_paged_sum, cached_paged_sum,
                        )  # fmt: skip
                        if budget is not None:
                            break
                        extend_paged = ceil_page(extend, page)
            # commit: lock the prefix, reserve, count
            room -= device
            total_offset += extend_paged + page if cut else extend_paged + page + max_new
            current_offset += extend_paged + page
            log_input_tokens += extend
            extend_paged_sum += extend_paged
            cached_paged_sum += prefix
            batch_requests += 1
            accepted.append(new_accepted(rids[pos], prefix, extend, cut, False, host, loaded))
            if cut:
                self.chunk_index, self.chunk_prefix = pos, prefix + extend
                if release:
                    self.admitted[pos] = (stamp0 + pos, device, loaded)
            elif release:
                finished.append((pos, stamp0 + pos, device, loaded))
            pos += 1
            # budget_state(): stops the scan, the request stays admitted
            if (
                room - total_offset <= 0
                or room - current_offset <= 0
                or extend_paged_sum >= input_stop
            ):
                where = "after_admit"
                if room - total_offset <= 0:
                    budget = "rem_total_tokens"
                elif room - current_offset <= 0:
                    budget = "cur_rem_tokens"
                elif extend_paged_sum >= max_prefill:
                    budget = "rem_input_tokens"
                else:
                    budget = "rem_chunk_tokens"
        self.head, self.room, self.free_slots = pos, room, free_slots
        decisions = chunk_decision + pos - first
        if where == "after_admit":
            result = NO_TOKEN if budget in ("rem_total_tokens", "cur_rem_tokens") else OTHER
        elif where == "scan_top":
            result = OTHER
        else:
            result = where
            if where in (NO_TOKEN, OTHER):
                where = "refused"
                decisions += 1
        self.evaluations += decisions
        if quick_loads:
            self.n_loads += quick_loads
            self.n_loaded += quick_loaded
        return new_tick(
            tick, tuple(accepted), rids[pos] if pos < end else None, result, budget, where,
            cached_paged_sum - chunk_cached_paged, log_input_tokens, extend_paged_sum,
            cached_paged_sum, batch_requests, free_slots, room - free_slots, tuple(events),
            room - total_offset, room - current_offset, max_prefill - extend_paged_sum,
            chunk_tokens - extend_paged_sum if chunking else None, decisions,
            (time.perf_counter_ns() - start_ns) / 1000.0,
        )  # fmt: skip

    # -- rare paths ------------------------------------------------------------------------
    def _cp_stop(
        self, batch_requests: int, extend_paged_sum: int, cached_paged_sum: int,
        prefix: int, extend: int,
    ) -> str | None:  # fmt: skip
        """The CP limit that admitting ``(prefix, extend)`` would break, if any."""
        page = self.page_size
        return cp_limit_broken(
            batch_requests + 1,
            extend_paged_sum + ceil_page(extend, page),
            cached_paged_sum + ceil_page(prefix, page),
            self.cp_max_requests,
            self.cp_max_extend_tokens,
            self.cp_max_cached_tokens,
        )

    def _reselect(
        self, index: int, batch_requests: int, rem_input: int, rem_chunk: int | None,
        rem_total: float, extend_paged_sum: int, cached_paged_sum: int,
    ) -> tuple[int, int, bool, str, str | None]:  # fmt: skip
        """SGLang's ``_select_prefill_admission(h=0)`` after a declined load-back, plus CP."""
        page, prefix = self.page_size, self.device_prefix[index]
        extend = self.fill_tokens[index] - prefix
        if not (extend + self.max_new_tokens[index] + page < rem_total):
            return prefix, extend, False, NO_TOKEN, "rem_total_tokens"
        cut = False
        if rem_chunk is None:
            if batch_requests and ceil_page(extend, page) >= rem_input:
                return prefix, extend, False, OTHER, "rem_input_tokens"
        elif ceil_page(extend, page) > rem_chunk:
            extend = floor_page(prefix + floor_page(rem_chunk, page), page) - prefix
            if extend <= 0:
                return prefix, extend, False, OTHER, "rem_chunk_tokens"
            cut = True
        if self.cp_on and batch_requests:
            budget = self._cp_stop(
                batch_requests, extend_paged_sum, cached_paged_sum, prefix, extend
            )
            if budget is not None:
                return prefix, extend, cut, OTHER, budget
        return prefix, extend, cut, QUEUE_EXHAUSTED, None
