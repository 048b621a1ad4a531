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
:class:`~cpkv.admit.admission_state.AdmissionState`): declined when ``H <
max(1, load_back_threshold)`` or above ``load_back_quota_tokens``; when fewer than ``H``
slots are free, unlocked L1 nodes are evicted (LRU, whole nodes) until enough are, declined
if they still are not. Success takes ``H`` slots at once; the request then computes only
``E`` tokens.
"""

from __future__ import annotations

import time

from cpkv.admit.admission_state import AdmissionState
from cpkv.admit.records import (
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


class PrefillAdderModel(AdmissionState):
    """SGLang's scheduling pass (add_chunked_req, the scan, add_one_req) over the state."""

    __slots__ = ()

    # -- one pass ------------------------------------------------------------------------
    def run_pass(self, tick: int) -> TickRecord:
        """One scheduling pass. The hot path keeps every budget in a local int and leaves
        only the rare cases (eviction, declined load-back, CP limits hit) to methods."""
        t0 = time.perf_counter_ns()
        page = self.page
        fill, dev, host, mxl, rids = self.fill, self.dev, self.host, self.max_new, self.rids
        total_off = self.running_offset
        cur_off = 0
        rem_input = self.max_prefill
        rem_chunk = self.chunk_size
        accepted: list[AcceptedRequest] = []
        self.events = events = []
        self.finished = finished = []
        n_run = log_hit = log_in = cp_ext = cp_cached = decisions = 0
        base = self.base
        if self.chunk_idx >= 0:  # add_chunked_req
            decisions = 1
            i, prefix = self.chunk_idx, self.chunk_prefix
            lim = min(rem_chunk, int(base - total_off))
            if lim <= 0:
                lim = rem_chunk
            c = fill[i] - prefix
            trunc = c > lim
            e = lim if trunc else c
            ep = -(-e // page) * page
            total_off += ep + page + (0 if trunc else mxl[i])
            cur_off += ep + page
            rem_input -= ep
            rem_chunk -= ep
            log_in += e
            cp_ext += ep
            cp_cached += -(-prefix // page) * page
            n_run = 1
            accepted.append(new_accepted(rids[i], prefix, e, trunc, True, 0, 0))
            if trunc:
                self.chunk_prefix = prefix + e
            else:
                self.chunk_idx = -1
                if self.release:
                    finished.append((i, *self.admitted.pop(i)))
        q, n, cap, pmr = self.head, self.n, self.cap, self.pmr
        # a refusal sets `where` to its result (NO_TOKEN / OTHER); mapped to "refused" below
        where, budget = QUEUE_EXHAUSTED, None
        if q < n and base - total_off > 0 and base - cur_off > 0:  # budget_state() at the top
            if rem_input <= 0:
                where, budget = "scan_top", "rem_input_tokens"
            elif rem_chunk is not None and rem_chunk <= 0:
                where, budget = "scan_top", "rem_chunk_tokens"
        cp_on, cp_batch, cp_ext_max, cp_cached_max = (
            self.cp_on,
            self.cp_batch,
            self.cp_ext_max,
            self.cp_cached_max,
        )
        thr, quota, release, avail = self.threshold, self.quota, self.release, self.avail
        while budget is None and q < n:
            if n_run >= cap:
                where, budget = BATCH_FULL, "max_running_requests"
                break
            i = q
            decisions += 1
            if n_run >= pmr:
                where, budget = OTHER, "prefill_max_requests"
                break
            d, h, ln, mx = dev[i], host[i], fill[i], mxl[i]
            if not ln - d + mx + page < base - d - total_off:
                where, budget = NO_TOKEN, "rem_total_tokens"
                break
            p = d + h  # page aligned: both come from whole-page radix matches
            e = ln - p
            ep = -(-e // page) * page
            chunked = False
            if rem_chunk is None:
                if n_run and ep >= rem_input:
                    where, budget = OTHER, "rem_input_tokens"
                    break
            elif ep > rem_chunk:
                ep = e = rem_chunk // page * page
                if e <= 0:
                    where, budget = OTHER, "rem_chunk_tokens"
                    break
                chunked = True
            if (
                cp_on
                and n_run
                and (n_run >= cp_batch or cp_ext + ep > cp_ext_max or cp_cached + p > cp_cached_max)
            ):
                where, budget = OTHER, self._cp_stop(n_run, cp_ext, cp_cached, p, e)
                break
            loaded = 0
            if h:
                if h >= thr and quota is None and avail >= h:  # loads without eviction
                    events.append(
                        new_load_back_event(rids[i], h, h, h, None, avail, avail - h, 0, "loaded")
                    )
                    avail -= h
                    base -= h
                    loaded = h
                else:
                    loaded, avail = self._load_back(i, h, avail)
                    if loaded:
                        base -= loaded
                    else:  # declined: select again with no host hit
                        p, e, chunked, where, budget = self._reselect(
                            i, n_run, rem_input, rem_chunk, base - d - total_off, cp_ext, cp_cached
                        )
                        if budget is not None:
                            break
                        ep = -(-e // page) * page
            # commit: lock the prefix, reserve, count
            base -= d
            total_off += ep + page + (0 if chunked else mx)
            cur_off += ep + page
            rem_input -= ep
            if rem_chunk is not None:
                rem_chunk -= ep
            log_hit += p
            log_in += e
            cp_ext += ep
            cp_cached += p
            n_run += 1
            accepted.append(new_accepted(rids[i], p, e, chunked, False, h, loaded))
            q += 1
            if chunked:
                self.chunk_idx, self.chunk_prefix = i, p + e
                if release:
                    self.admitted[i] = (self.evals + decisions, d, loaded)
            elif release:
                finished.append((i, self.evals + decisions, d, loaded))
            # budget_state(): stops the scan, the request stays admitted
            if base - total_off <= 0:
                where, budget = "after_admit", "rem_total_tokens"
            elif base - cur_off <= 0:
                where, budget = "after_admit", "cur_rem_tokens"
            elif rem_input <= 0:
                where, budget = "after_admit", "rem_input_tokens"
            elif rem_chunk is not None and rem_chunk <= 0:
                where, budget = "after_admit", "rem_chunk_tokens"
        self.head, self.base, self.avail = q, base, avail
        self.evals += decisions
        if where == "after_admit":
            result = NO_TOKEN if budget in ("rem_total_tokens", "cur_rem_tokens") else OTHER
        elif where == "scan_top":
            result = OTHER
        else:
            result = where
            where = "refused" if where in (NO_TOKEN, OTHER) else where
        return new_tick(
            tick, tuple(accepted), rids[q] if q < n else None, result, budget, where,
            log_hit, log_in, cp_ext, cp_cached, n_run, avail, base - avail, tuple(events),
            base - total_off, base - cur_off, rem_input, rem_chunk, decisions,
            (time.perf_counter_ns() - t0) / 1000.0,
        )  # fmt: skip

    # -- rare paths ----------------------------------------------------------------------
    def _cp_stop(self, n_run: int, cp_ext: int, cp_cached: int, p: int, e: int) -> str | None:
        """The CP limit that admitting ``(p, e)`` would break, if any."""
        page = self.page
        if n_run + 1 > self.cp_batch:
            return "cp_max_batch_requests"
        if cp_ext + -(-e // page) * page > self.cp_ext_max:
            return "cp_max_total_extend_tokens"
        if cp_cached + -(-p // page) * page > self.cp_cached_max:
            return "cp_max_total_cached_tokens"
        return None

    def _reselect(
        self, i: int, n_run: int, rem_input: int, rem_chunk: int | None,
        rem_total: float, cp_ext: int, cp_cached: int,
    ) -> tuple[int, int, bool, str, str | None]:  # fmt: skip
        """SGLang's ``_select_prefill_admission(h=0)`` after a declined load-back, plus CP."""
        page, d = self.page, self.dev[i]
        p, e = d, self.fill[i] - d
        if not (e + self.max_new[i] + page < rem_total):
            return p, e, False, NO_TOKEN, "rem_total_tokens"
        ein = -(-e // page) * page
        chunked = False
        if rem_chunk is None:
            if n_run and ein >= rem_input:
                return p, e, False, OTHER, "rem_input_tokens"
        elif ein > rem_chunk:
            e = (p + rem_chunk // page * page) // page * page - p
            if e <= 0:
                return p, e, False, OTHER, "rem_chunk_tokens"
            chunked = True
        if self.cp_on and n_run:
            budget = self._cp_stop(n_run, cp_ext, cp_cached, p, e)
            if budget is not None:
                return p, e, chunked, OTHER, budget
        return p, e, chunked, QUEUE_EXHAUSTED, None
