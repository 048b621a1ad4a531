"""The admission state that outlives a pass: requests, L1 allocator and cache, queue, chunk.

:class:`AdmissionState` holds, per request, its current device prefix ``D`` and host hit
``H`` (page aligned; see :func:`cpkv.workload.request.device_and_host_hit`), and for the whole
run the L1 allocator's free slots, the unlocked (evictable) L1 cache, the queue head, the
request being chunked and, with ``release_each_tick``, the released requests' L1 nodes. It
also does the L2 load-back with its LRU eviction; :mod:`cpkv.admission.adder` runs the
passes on it.

Memory bookkeeping: ``room`` is SGLang's ``available_size() + evictable_size()``; it only
drops when a request is admitted (its prefix becomes locked) or an L2 hit is loaded back (new
locked slots), and grows when a finished request releases its nodes. Evicting moves tokens
from evictable to free, which leaves ``room`` unchanged.

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
        "rids", "fill_tokens", "device_prefix", "host_hit", "max_new_tokens", "initial_device_prefix", "initial_host_hit", "n_requests", "page_size",
        "free_slots", "room", "other_evictable", "lru_next", "head", "chunk_index", "chunk_prefix",
        "running_offset", "max_prefill_tokens", "chunk_tokens", "max_running", "prefill_max_requests", "load_back_threshold", "load_back_quota",
        "cp_on", "cp_max_requests", "cp_max_extend_tokens", "cp_max_cached_tokens", "release_each_tick", "released",
        "released_tokens", "admitted", "finished", "events", "evaluations", "n_loads", "n_loaded",
        "n_declined", "n_evicted", "n_continuations",
    )  # fmt: skip

    def __init__(self, requests: Sequence[Request], budgets: AdmitBudgets) -> None:
        page = budgets.page_size
        self.page_size = page
        self.n_requests = len(requests)
        self.rids = [r.rid for r in requests]
        self.fill_tokens = [
            r.l1_cached_tokens + r.l2_cached_tokens + r.extend_tokens for r in requests
        ]
        if page > 1:  # see device_and_host_hit(): whole pages only
            self.initial_device_prefix = [r.l1_cached_tokens // page * page for r in requests]
            self.initial_host_hit = [
                (r.l1_cached_tokens + r.l2_cached_tokens) // page * page
                - r.l1_cached_tokens // page * page
                for r in requests
            ]
        else:
            self.initial_device_prefix = [r.l1_cached_tokens for r in requests]
            self.initial_host_hit = [r.l2_cached_tokens for r in requests]
        self.device_prefix = list(self.initial_device_prefix)
        self.host_hit = list(self.initial_host_hit)
        default = min(budgets.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        max_new = [r.max_new_tokens for r in requests]
        if max_new and (None in max_new or max(max_new) > CLIP_MAX_NEW_TOKENS):
            max_new = [
                default if m is None else m if m < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS
                for m in max_new
            ]  # the common case (all given, none above the clip) keeps the list as it is
        self.max_new_tokens = max_new
        self.free_slots = budgets.allocator_tokens()
        self.other_evictable = budgets.other_evictable_tokens()
        self.room = (
            self.free_slots + self.other_evictable + sum(self.device_prefix)
        )  # available + evictable
        self.lru_next = 0
        self.head = 0
        self.chunk_index = -1
        self.chunk_prefix = 0
        self.running_offset = budgets.running_offset()
        self.max_prefill_tokens = budgets.max_prefill_tokens
        self.chunk_tokens = budgets.chunk_tokens
        cap = budgets.batch_capacity()
        self.max_running = NO_CAP if cap is None else cap
        pmr = budgets.prefill_max_requests
        self.prefill_max_requests = NO_CAP if pmr is None else pmr
        self.load_back_threshold = max(1, budgets.load_back_threshold)
        self.load_back_quota = budgets.load_back_quota_tokens
        cp = budgets.cp
        self.cp_on = cp.active
        self.cp_max_requests = (
            cp.max_batch_requests if cp.max_batch_requests is not None else NO_CAP
        )
        self.cp_max_extend_tokens = (
            NO_CAP if cp.max_total_extend_tokens is None else cp.max_total_extend_tokens
        )
        self.cp_max_cached_tokens = (
            NO_CAP if cp.max_total_cached_tokens is None else cp.max_total_cached_tokens
        )
        self.release_each_tick = budgets.release_each_tick
        # released L1 nodes in eviction order: (stamp, tokens), by stamp, each leaf first
        self.released: deque[tuple[int, int]] = deque()
        self.released_tokens = 0
        self.admitted: dict[int, tuple[int, int, int]] = {}  # chunked, release: (stamp, D, loaded)
        self.finished: list[tuple[int, int, int, int]] = []  # release: (i, stamp, D, loaded)
        self.events: list[LoadBackEvent] = []
        self.evaluations = 0
        # run totals, counted as the passes go (records.RunCounts)
        self.n_loads = self.n_loaded = self.n_declined = self.n_evicted = 0
        self.n_continuations = 0

    def counts(self) -> RunCounts:
        """What the passes so far did (equal to ``records.count_records`` of their ticks)."""
        return RunCounts(
            self.head, self.n_continuations, self.evaluations, self.n_loads, self.n_loaded,
            self.n_declined, self.n_evicted,
        )  # fmt: skip

    # -- queue state ---------------------------------------------------------------------
    def has_work(self) -> bool:
        """True while a request waits or a chunked request is unfinished."""
        return self.head < self.n_requests or self.chunk_index >= 0

    @property
    def evictable(self) -> int:
        """Unlocked L1 tokens (other cache, waiting prefixes, released requests)."""
        return self.room - self.free_slots

    def _load_back(self, index: int, host_hit: int, free_slots: int) -> tuple[int, int]:
        """Load ``host_hit`` L2 tokens of request ``index`` into L1, all or nothing, with
        ``free_slots`` free; returns ``(tokens loaded, free slots after)``.

        When fewer slots are free than the hit needs, unlocked L1 nodes are evicted, least
        recently used first and whole nodes at a time, until enough are: the other cache, then
        the prefixes of the requests waiting behind ``index`` (each keeps its L2 copy: its hit
        moves to L2), then released requests.
        """
        free_before = free_slots
        freed = loaded = 0
        quota = self.load_back_quota
        if host_hit < self.load_back_threshold:
            outcome = "below_threshold"
        elif quota is not None and host_hit > quota:
            outcome = "over_quota"
        else:
            if free_slots < host_hit:
                need = host_hit - free_slots
                if self.other_evictable:
                    freed, self.other_evictable = self.other_evictable, 0
                victim, end = self.lru_next, self.n_requests
                if victim <= index:
                    victim = index + 1
                if freed < need and victim < end:
                    device_prefix, host_hits = self.device_prefix, self.host_hit
                    while freed < need and victim < end:
                        prefix = device_prefix[victim]
                        if prefix:
                            host_hits[victim] += prefix  # its L2 copy stays: the hit moves to L2
                            device_prefix[victim] = 0
                            freed += prefix
                        victim += 1
                self.lru_next = victim
                if freed < need and self.released:
                    freed += self._evict_released(need - freed)
                free_slots += freed
            if free_slots < host_hit:
                outcome = "no_room"
            else:
                free_slots -= host_hit
                loaded = host_hit
                outcome = "loaded"
        if loaded:
            self.n_loads += 1
            self.n_loaded += loaded
        else:
            self.n_declined += 1
        if freed:
            self.n_evicted += freed
        self.events.append(
            new_load_back_event(
                self.rids[index], host_hit, host_hit, loaded, quota, free_before, free_slots,
                freed, outcome,
            )
        )  # fmt: skip
        return loaded, free_slots

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
        nodes, total = self.released, 0
        initial_host, initial_device = self.initial_host_hit, self.initial_device_prefix
        append = nodes.append
        for index, stamp, device, loaded in self.finished:
            if nodes and stamp < nodes[-1][0]:
                total += self._insert_released(index, stamp, device, loaded)
                continue
            if loaded:
                if device:
                    append((stamp, loaded))
                    append((stamp, device))
                else:  # its own prefix was evicted: it loaded its two original nodes
                    host0, device0 = initial_host[index], initial_device[index]
                    if host0 and device0:
                        append((stamp, host0))
                        append((stamp, device0))
                    else:
                        append((stamp, loaded))
            elif device:
                append((stamp, device))
            else:
                continue
            total += loaded + device
        self.released_tokens += total
        self.room += total

    def _insert_released(self, index: int, stamp: int, device: int, loaded: int) -> int:
        """The nodes of request ``index`` put in stamp order (kept general; not expected)."""
        host0, device0 = self.initial_host_hit[index], self.initial_device_prefix[index]
        if loaded and device:
            chain = [loaded, device]
        elif loaded:
            chain = [host0, device0] if host0 and device0 else [loaded]
        else:
            chain = [device] if device else []
        nodes = list(self.released)
        at = bisect_left([node_stamp for node_stamp, _ in nodes], stamp)
        nodes[at:at] = [(stamp, size) for size in chain]
        self.released.clear()  # in place: release_finished holds a reference
        self.released.extend(nodes)
        return loaded + device
