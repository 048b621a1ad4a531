"""The admission state that outlives a pass: requests, L1 allocator and cache, queue, chunk.

:class:`AdmissionState` holds, per request, its current device prefix ``D`` and host hit
``H`` (page aligned; see :func:`cpkv.workload.request.device_and_host_hit`), and for the whole
run the L1 allocator's free slots, the unlocked (evictable) L1 cache, the queue head, the
request being chunked and, with ``release_each_tick``, the released requests' L1 nodes. It
also does the L2 load-back with its LRU eviction; :mod:`cpkv.admission.adder` runs the
passes on it.

Memory bookkeeping: ``base`` is SGLang's ``available_size() + evictable_size()``; it only
drops when a request is admitted (its prefix becomes locked) or an L2 hit is loaded back (new
locked slots), and grows when a finished request releases its nodes. Evicting moves tokens
from evictable to free, which leaves ``base`` unchanged.

LRU order of the unlocked L1 nodes (that of the real backend's setup, see
:mod:`cpkv.admission.sglang.backend`): the other cache (``evictable_tokens``, one node), then the
waiting requests' prefixes in queue order (the candidate and admitted requests are locked;
a waiting request is only touched when it becomes the candidate, so queue order is also
access order), then released requests by the order they were evaluated, each leaf first
(the loaded L2 node, then its L1 prefix). An evicted waiting prefix keeps its L2 copy
(HiCache writes through): that request's hit becomes ``D = 0``, ``H = D + H``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence

from cpkv.admission.budgets import AdmitBudgets
from cpkv.admission.records import LoadBackEvent, RunCounts, new_load_back_event
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS, Request

NO_CAP = 1 << 62
"""Stands for "no limit" in integer comparisons."""


class AdmissionState:
    """Everything a pass reads and leaves for the next one (plain ints and lists)."""

    __slots__ = (
        "rids", "fill", "dev", "host", "max_new", "dev0", "host0", "n", "page",
        "avail", "base", "other", "lru", "head", "chunk_idx", "chunk_prefix",
        "running_offset", "max_prefill", "chunk_size", "cap", "pmr", "threshold", "quota",
        "cp_on", "cp_batch", "cp_ext_max", "cp_cached_max", "release", "released",
        "released_tokens", "admitted", "finished", "events", "evals", "n_loads", "n_loaded",
        "n_declined", "n_evicted", "n_continuations",
    )  # fmt: skip

    def __init__(self, requests: Sequence[Request], budgets: AdmitBudgets) -> None:
        page = budgets.page_size
        self.page = page
        self.n = len(requests)
        self.rids = [r.rid for r in requests]
        self.fill = [r.l1_cached_tokens + r.l2_cached_tokens + r.extend_tokens for r in requests]
        if page > 1:  # see device_and_host_hit(): whole pages only
            self.dev0 = [r.l1_cached_tokens // page * page for r in requests]
            self.host0 = [
                (r.l1_cached_tokens + r.l2_cached_tokens) // page * page
                - r.l1_cached_tokens // page * page
                for r in requests
            ]
        else:
            self.dev0 = [r.l1_cached_tokens for r in requests]
            self.host0 = [r.l2_cached_tokens for r in requests]
        self.dev = list(self.dev0)
        self.host = list(self.host0)
        default = min(budgets.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        max_new = [r.max_new_tokens for r in requests]
        if max_new and (None in max_new or max(max_new) > CLIP_MAX_NEW_TOKENS):
            max_new = [
                default if m is None else m if m < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS
                for m in max_new
            ]  # the common case (all given, none above the clip) keeps the list as it is
        self.max_new = max_new
        self.avail = budgets.allocator_tokens()
        self.other = budgets.other_evictable_tokens()
        self.base = self.avail + self.other + sum(self.dev)  # available + evictable
        self.lru = 0
        self.head = 0
        self.chunk_idx = -1
        self.chunk_prefix = 0
        self.running_offset = budgets.running_offset()
        self.max_prefill = budgets.max_prefill_tokens
        self.chunk_size = budgets.chunk_tokens
        cap = budgets.batch_capacity()
        self.cap = NO_CAP if cap is None else cap
        pmr = budgets.prefill_max_requests
        self.pmr = NO_CAP if pmr is None else pmr
        self.threshold = max(1, budgets.load_back_threshold)
        self.quota = budgets.load_back_quota_tokens
        cp = budgets.cp
        self.cp_on = cp.active
        self.cp_batch = cp.max_batch_requests if cp.max_batch_requests is not None else NO_CAP
        self.cp_ext_max = (
            NO_CAP if cp.max_total_extend_tokens is None else cp.max_total_extend_tokens
        )
        self.cp_cached_max = (
            NO_CAP if cp.max_total_cached_tokens is None else cp.max_total_cached_tokens
        )
        self.release = budgets.release_each_tick
        # released L1 nodes in eviction order: (stamp, tokens), by stamp, each leaf first
        self.released: deque[tuple[int, int]] = deque()
        self.released_tokens = 0
        self.admitted: dict[int, tuple[int, int, int]] = {}  # chunked, release: (stamp, D, loaded)
        self.finished: list[tuple[int, int, int, int]] = []  # release: (i, stamp, D, loaded)
        self.events: list[LoadBackEvent] = []
        self.evals = 0
        # run totals, counted as the passes go (records.RunCounts)
        self.n_loads = self.n_loaded = self.n_declined = self.n_evicted = 0
        self.n_continuations = 0

    def counts(self) -> RunCounts:
        """What the passes so far did (equal to ``records.count_records`` of their ticks)."""
        return RunCounts(
            self.head, self.n_continuations, self.evals, self.n_loads, self.n_loaded,
            self.n_declined, self.n_evicted,
        )  # fmt: skip

    # -- queue state ---------------------------------------------------------------------
    def has_work(self) -> bool:
        """True while a request waits or a chunked request is unfinished."""
        return self.head < self.n or self.chunk_idx >= 0

    @property
    def evictable(self) -> int:
        """Unlocked L1 tokens (other cache, waiting prefixes, released requests)."""
        return self.base - self.avail

    def _load_back(self, i: int, h: int, avail: int) -> tuple[int, int]:
        """Load ``h`` L2 tokens of request ``i`` into L1, all or nothing, with ``avail`` free
        slots; returns ``(tokens loaded, free slots after)``.

        When fewer than ``h`` slots are free, unlocked L1 nodes are evicted, least recently
        used first and whole nodes at a time, until enough are: the other cache, then the
        prefixes of the requests waiting behind ``i`` (each keeps its L2 copy: its hit moves
        to L2), then released requests.
        """
        before = avail
        freed = loaded = 0
        quota = self.quota
        if h < self.threshold:
            outcome = "below_threshold"
        elif quota is not None and h > quota:
            outcome = "over_quota"
        else:
            if avail < h:
                need = h - avail
                if self.other:
                    freed, self.other = self.other, 0
                j, n = self.lru, self.n
                if j <= i:
                    j = i + 1
                if freed < need and j < n:
                    dev, host = self.dev, self.host
                    while freed < need and j < n:
                        d = dev[j]
                        if d:
                            host[j] += d
                            dev[j] = 0
                            freed += d
                        j += 1
                self.lru = j
                if freed < need and self.released:
                    freed += self._evict_released(need - freed)
                avail += freed
            if avail < h:
                outcome = "no_room"
            else:
                avail -= h
                loaded = h
                outcome = "loaded"
        if loaded:
            self.n_loads += 1
            self.n_loaded += loaded
        else:
            self.n_declined += 1
        if freed:
            self.n_evicted += freed
        self.events.append(
            new_load_back_event(self.rids[i], h, h, loaded, quota, before, avail, freed, outcome)
        )
        return loaded, avail

    def _evict_released(self, need: int) -> int:
        """Evict released nodes (oldest evaluation first, leaf first); returns tokens freed."""
        freed, nodes = 0, self.released
        pop = nodes.popleft
        while freed < need and nodes:
            freed += pop()[1]
        self.released_tokens -= freed
        return freed

    def release_finished(self) -> None:
        """End of tick with ``release_each_tick``: finished requests unlock their L1 nodes.

        A request holds the radix nodes of its L1 prefix and of the L2 tokens it loaded; they
        become evictable, leaf (loaded part) first. If its own prefix had been evicted before
        it was admitted, the L2 path it loaded is its two original nodes.

        Requests finish in evaluation order (a chunked request admits nothing after it in its
        pass, and nothing is admitted while its chunks continue), so the nodes are appended
        at the end of :attr:`released`; an out-of-order stamp would be inserted in place.
        """
        nodes, host0, dev0, total = self.released, self.host0, self.dev0, 0
        append = nodes.append
        for i, stamp, d, loaded in self.finished:
            if nodes and stamp < nodes[-1][0]:
                total += self._insert_released(i, stamp, d, loaded)
                continue
            if loaded:
                if d:
                    append((stamp, loaded))
                    append((stamp, d))
                else:
                    h0, d0 = host0[i], dev0[i]
                    if h0 and d0:
                        append((stamp, h0))
                        append((stamp, d0))
                    else:
                        append((stamp, loaded))
            elif d:
                append((stamp, d))
            else:
                continue
            total += loaded + d
        self.released_tokens += total
        self.base += total

    def _insert_released(self, i: int, stamp: int, d: int, loaded: int) -> int:
        """The nodes of request ``i`` put in stamp order (kept general; not expected)."""
        h0, d0 = self.host0[i], self.dev0[i]
        if loaded and d:
            chain = [loaded, d]
        elif loaded:
            chain = [h0, d0] if h0 and d0 else [loaded]
        else:
            chain = [d] if d else []
        nodes = list(self.released)
        at = bisect_left([s for s, _ in nodes], stamp)
        nodes[at:at] = [(stamp, size) for size in chain]
        self.released.clear()  # in place: release_finished holds a reference
        self.released.extend(nodes)
        return loaded + d
