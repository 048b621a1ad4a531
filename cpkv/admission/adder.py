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


class PrefillAdderModel(AdmissionState):
    """SGLang's scheduling pass (add_chunked_req, the scan, add_one_req) over the state."""

    __slots__ = ()

    # -- one pass ------------------------------------------------------------------------
    def run_pass(self, tick: int) -> TickRecord:
        """One scheduling pass. The hot path keeps every budget in a local int and leaves
        only the rare cases (eviction, declined load-back, CP limits hit) to methods.

        Running sums: ``cp_ext`` (page-aligned extend tokens, continuing chunk included),
        ``cur_off``, ``total_off``, ``cp_cached``, ``log_in``. SGLang's ``rem_input_tokens``
        is ``max_prefill - cp_ext``, ``rem_chunk_tokens`` is ``chunk_size - cp_ext`` and
        ``log_hit`` is ``cp_cached`` less the continuing chunk's prefix: they are derived,
        not tracked. So is ``decisions`` (the scanned requests, plus the chunk and a
        refused candidate)."""
        t0 = time.perf_counter_ns()
        page = self.page
        fill, dev, host, mxl, rids = self.fill, self.dev, self.host, self.max_new, self.rids
        total_off = self.running_offset
        max_prefill, chunk_size = self.max_prefill, self.chunk_size
        chunking = chunk_size is not None
        accepted: list[AcceptedRequest] = []
        self.events = events = []
        self.finished = finished = []
        n_run = log_in = cp_ext = cp_cached = cur_off = chunk_cached = chunk_decision = 0
        base = self.base
        if self.chunk_idx >= 0:  # add_chunked_req (chunking is on)
            chunk_decision = 1
            self.n_continuations += 1
            i, prefix = self.chunk_idx, self.chunk_prefix
            lim = min(chunk_size, int(base - total_off))
            if lim <= 0:
                lim = chunk_size
            c = fill[i] - prefix
            trunc = c > lim
            e = lim if trunc else c
            ep = -(-e // page) * page
            total_off += ep + page + (0 if trunc else mxl[i])
            cur_off = ep + page
            log_in = e
            cp_ext = ep
            cp_cached = chunk_cached = -(-prefix // page) * page
            n_run = 1
            accepted.append(new_accepted(rids[i], prefix, e, trunc, True, 0, 0))
            if trunc:
                self.chunk_prefix = prefix + e
            else:
                self.chunk_idx = -1
                if self.release:
                    finished.append((i, *self.admitted.pop(i)))
        q0 = q = self.head
        n = self.n
        # a refusal sets `where` to its result (NO_TOKEN / OTHER); mapped to "refused" below
        where, budget = QUEUE_EXHAUSTED, None
        if q < n and base - total_off > 0 and base - cur_off > 0:  # budget_state() at the top
            if cp_ext >= max_prefill:
                where, budget = "scan_top", "rem_input_tokens"
            elif chunking and cp_ext >= chunk_size:
                where, budget = "scan_top", "rem_chunk_tokens"
        cap, pmr = self.cap, self.pmr
        cap_pmr = min(cap, pmr)
        input_stop = min(max_prefill, chunk_size) if chunking else max_prefill
        cp_on, cp_batch, cp_ext_max, cp_cached_max = (
            self.cp_on,
            self.cp_batch,
            self.cp_ext_max,
            self.cp_cached_max,
        )
        thr, quota, release, avail = self.threshold, self.quota, self.release, self.avail
        stamp0 = self.evals + chunk_decision + 1 - q0  # request q is evaluation stamp0 + q
        quick_loads = quick_loaded = 0  # load-backs that needed no eviction (counted below)
        while budget is None and q < n:
            if n_run >= cap_pmr:
                if n_run >= cap:
                    where, budget = BATCH_FULL, "max_running_requests"
                else:
                    where, budget = OTHER, "prefill_max_requests"
                break
            d = dev[q]
            ln = fill[q]
            mx = mxl[q]
            if not ln - d + mx + page < base - d - total_off:
                where, budget = NO_TOKEN, "rem_total_tokens"
                break
            h = host[q]
            p = d + h  # page aligned: both come from whole-page radix matches
            e = ln - p
            ep = -(-e // page) * page
            chunked = False
            if not chunking:
                if n_run and cp_ext + ep >= max_prefill:
                    where, budget = OTHER, "rem_input_tokens"
                    break
            elif cp_ext + ep > chunk_size:
                ep = e = (chunk_size - cp_ext) // page * page
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
                        new_load_back_event(rids[q], h, h, h, None, avail, avail - h, 0, "loaded")
                    )
                    avail -= h
                    base -= h
                    loaded = h
                    quick_loads += 1
                    quick_loaded += h
                else:
                    loaded, avail = self._load_back(q, h, avail)
                    if loaded:
                        base -= loaded
                    else:  # declined: select again with no host hit
                        p, e, chunked, where, budget = self._reselect(
                            q, n_run, max_prefill - cp_ext,
                            chunk_size - cp_ext if chunking else None,
                            base - d - total_off, cp_ext, cp_cached,
                        )  # fmt: skip
                        if budget is not None:
                            break
                        ep = -(-e // page) * page
            # commit: lock the prefix, reserve, count
            base -= d
            total_off += ep + page if chunked else ep + page + mx
            cur_off += ep + page
            log_in += e
            cp_ext += ep
            cp_cached += p
            n_run += 1
            accepted.append(new_accepted(rids[q], p, e, chunked, False, h, loaded))
            if chunked:
                self.chunk_idx, self.chunk_prefix = q, p + e
                if release:
                    self.admitted[q] = (stamp0 + q, d, loaded)
            elif release:
                finished.append((q, stamp0 + q, d, loaded))
            q += 1
            # budget_state(): stops the scan, the request stays admitted
            if base - total_off <= 0 or base - cur_off <= 0 or cp_ext >= input_stop:
                where = "after_admit"
                if base - total_off <= 0:
                    budget = "rem_total_tokens"
                elif base - cur_off <= 0:
                    budget = "cur_rem_tokens"
                else:
                    budget = "rem_input_tokens" if cp_ext >= max_prefill else "rem_chunk_tokens"
        self.head, self.base, self.avail = q, base, avail
        decisions = chunk_decision + q - q0
        if where == "after_admit":
            result = NO_TOKEN if budget in ("rem_total_tokens", "cur_rem_tokens") else OTHER
        elif where == "scan_top":
            result = OTHER
        else:
            result = where
            if where in (NO_TOKEN, OTHER):
                where = "refused"
                decisions += 1
        self.evals += decisions
        if quick_loads:
            self.n_loads += quick_loads
            self.n_loaded += quick_loaded
        return new_tick(
            tick, tuple(accepted), rids[q] if q < n else None, result, budget, where,
            cp_cached - chunk_cached, log_in, cp_ext, cp_cached, n_run, avail, base - avail,
            tuple(events), base - total_off, base - cur_off, max_prefill - cp_ext,
            chunk_size - cp_ext if chunking else None, decisions,
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
