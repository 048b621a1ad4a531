"""SGLang 0.5.23's scheduler loop, one iteration at a time: ``event_loop_normal`` and
``event_loop_overlap`` with ``get_next_batch_to_run``, ``get_new_batch_prefill``,
``update_running_batch`` and the batch-result processing, over the model's pool and radix
cache.

Each :meth:`Loop.step` is one pass of the event loop after the arrivals were added
(:meth:`Loop.add_request`):

1. the last batch, if it prefilled, leaves the chunked request aside (its computed part
   enters the tree), drops its finished requests and joins the running batch;
2. a prefill batch is built whenever the ``PrefillAdder`` admits something
   (:mod:`cpkv.sglang.adder`); the ``batch_is_full`` latch skips the attempt until a running
   request leaves; with ``enable_mixed_chunk`` (and chunked prefill) the running requests
   decode in the same batch when the next decode step fits;
3. otherwise the running batch decodes: when the next step's KV does not fit even after
   evicting the radix cache, requests are retracted (fewest outputs first, then the longest
   prompt) until it does, and the new-token ratio is re-estimated; else the ratio decays;
4. the batch runs (the listener's ``launch``: the caller's clock and records); its results are
   processed at once (normal loop) or after the next batch was launched (overlap loop): every
   request gets a token, a finished one leaves its KV to the tree and frees the rest, a
   request whose prompt is complete checkpoints it into the tree. The batch counts the
   requests whose token before came from the pass just before, and keeps the times of the
   others' tokens before (the listener's ``emitted``: the requests' token gaps).

A pass that runs nothing resets the ratio (``on_idle``).
"""

from __future__ import annotations

import random
import sys
from collections import deque
from typing import Any, Final

from cpkv.sglang.adder import CONTINUE, NO_TOKEN, OTHER, PrefillAdder
from cpkv.sglang.config import LoopConfig
from cpkv.sglang.listener import Listener
from cpkv.sglang.memory import KvPool
from cpkv.sglang.radix import RadixTree, dfs_weight_order
from cpkv.sglang.request import Req

PREFILL: Final = "prefill"
MIXED: Final = "mixed"
DECODE: Final = "decode"
WAITING_PREFIX_REFRESH_INTERVAL: Final = 32
WAITING_QUEUE_PREFIX_MATCH_MAX: Final = 128
IN_BATCH_PREFIX_CHECK: Final = 32
IN_BATCH_PREFIX_DEPRIORITIZE: Final = 32
INF: Final = float("inf")
SHORTEST_PREFILL: Final = "shortest-prefill-first"
FCFS_WHEN_LONG = ("lpm", "hrrn")
"""The cache-aware orders that run as ``fcfs`` above 128 waiting requests."""
CACHE_AWARE = ("lpm", "hrrn", "shortest-prefill-first", "dfs-weight")
"""The waiting-queue orders that match the queue in the radix cache (with it disabled: fcfs)."""


class Batch:
    """A ``ScheduleBatch``: its requests in order and, for an extend batch, the extend rows
    ``(req, prefix, extend, loaded)`` of its first requests (``loaded``: of the prefix, the
    tokens its admission loaded back from the host tier) and the decoding requests mixed in.
    Once launched: its pass (``ct``, the loop's ``forward_ct``), its start and end (set by
    the listener); once processed: ``gaps``, the requests that got a token from it whose
    token before came from the pass just before, and ``late``, the times of the tokens
    before of the others that had one (None: none). ``extend_num_tokens`` is SGLang's: the
    extend tokens when it was prepared to extend (plus a token a decoding request mixed in),
    kept by a decode of the same batch object; a launch adds it to the loop's
    ``processed_tokens`` (the counter ``hrrn`` ages the queue by)."""

    __slots__ = (
        "reqs", "batch_is_full", "mode", "rows", "decoding", "chunked", "end_us", "ct",
        "start_us", "gaps", "late", "extend_num_tokens",
    )  # fmt: skip

    def __init__(self, reqs: list[Req], batch_is_full: bool = False) -> None:
        self.reqs = reqs
        self.batch_is_full = batch_is_full
        self.mode: str | None = None
        self.rows: list[tuple[Req, int, int, int]] = []
        self.decoding: list[Req] | None = None
        self.chunked: Req | None = None
        self.end_us = self.start_us = 0.0
        self.ct = self.gaps = 0
        self.late: list[float] | None = None
        self.extend_num_tokens = 0  # set when it extends; a decode keeps what it had

    def copy(self) -> Batch:
        other = Batch(list(self.reqs), self.batch_is_full)
        other.mode, other.rows, other.decoding = self.mode, self.rows, self.decoding
        other.chunked, other.end_us = self.chunked, self.end_us
        other.ct, other.start_us = self.ct, self.start_us
        other.gaps, other.late = 0, None
        other.extend_num_tokens = self.extend_num_tokens
        return other

    def filter(self, exclude: Any = ()) -> None:
        """Drop finished requests and ``exclude``."""
        if exclude:
            self.reqs = [r for r in self.reqs if not r.finished and r not in exclude]
        else:
            self.reqs = [r for r in self.reqs if not r.finished]

    @property
    def is_extend(self) -> bool:
        return self.mode == PREFILL or self.mode == MIXED


def prefill_work(r: Req) -> int:
    """``_shortest_prefill_work``: the tokens of ``r`` (prompt and outputs) its last queue
    match did not find, at least 1."""
    work = r.prompt_len + r.output_len - r.matched_len
    return work if work > 1 else 1


class Loop:
    """One SGLang server's scheduler (see the module docstring)."""

    def __init__(self, config: LoopConfig, listener: Any = None) -> None:
        self.config = c = config
        self.listener: Any = Listener() if listener is None else listener  # (a Listener)
        self.pool = KvPool(
            c.max_total_num_tokens, c.page_size, c.max_running_requests, c.disable_radix_cache,
            c.hicache_tokens,
        )  # fmt: skip
        self.tree = self.pool.tree
        self.waiting: list[Req] = []
        self.running = Batch([])
        self.last_batch: Batch | None = None
        self.chunked_req: Req | None = None
        self.result_queue: deque[Batch] = deque()
        init = min(c.init_new_token_ratio * c.schedule_conservativeness, 1.0)
        self.ratio_init = init
        self.ratio_min = min(init * c.min_new_token_ratio_factor, 1.0)
        self.ratio_decay = (init - self.ratio_min) / c.new_token_ratio_decay_steps
        self.ratio = init
        self.forward_ct = 0
        self.prefix_touches = 0
        self.stops: dict[str, int] = {}  # what ended each admission attempt, by name
        self.entries = 0  # requests that joined the queue so far
        self.processed_tokens = 0  # SGLang's processed_tokens_counter (hrrn)
        self.rng = random.Random(c.seed)  # the random order's shuffles
        # the queue's order (``_validate_and_adjust_policy``: without the radix cache a
        # cache-aware order is fcfs)
        aware = c.schedule_policy in CACHE_AWARE
        self.order = "fcfs" if aware and c.disable_radix_cache else c.schedule_policy

    # -- arrivals -------------------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        """``init_req_max_new_tokens`` (clipped to the context and the pool), then the queue."""
        c, page = self.config, self.config.page_size
        max_new = max(0, min(req.max_new_tokens, c.context_len - req.prompt_len - 1))
        paged = -(-req.prompt_len // page) * page
        req.max_new_tokens = max(0, min(max_new, c.max_total_num_tokens - paged - page - 1))
        self._enqueue(req)

    def _enqueue(self, req: Req) -> None:
        """``_add_request_to_queue``: a request without a priority gets the lowest under
        priority scheduling; it joins the queue's end."""
        c = self.config
        if c.enable_priority_scheduling and req.priority is None:
            req.priority = sys.maxsize if c.schedule_low_priority_values_first else -sys.maxsize - 1
        self.entries += 1
        req.queue_entry = self.entries
        req.arrival_processed_tokens = self.processed_tokens
        self.waiting.append(req)

    def is_fully_idle(self) -> bool:
        return (
            not self.running.reqs
            and self.chunked_req is None
            and (self.last_batch is None or not self.last_batch.reqs)
            and not self.result_queue
            and not self.waiting
        )

    # -- one pass of the event loop -------------------------------------------------------
    def step(self) -> Batch | None:
        """One pass: the batch it launched (None: nothing ran)."""
        batch = self._next_batch()
        if not self.config.overlap:
            if batch is not None:
                self._launch(batch)
                self._process(batch)
            else:
                self._on_idle()
            self.last_batch = batch
            return batch
        if batch is not None:
            self._launch(batch)
            self.result_queue.append(batch.copy())
        if self.last_batch is not None:
            self._process(self.result_queue.popleft())
        elif batch is None:
            self._on_idle()
        self.last_batch = batch
        return batch

    def _launch(self, batch: Batch) -> None:
        self.forward_ct += 1
        self.processed_tokens += batch.extend_num_tokens
        batch.ct, batch.gaps, batch.late = self.forward_ct, 0, None  # (a running batch again)
        batch.chunked = self.chunked_req
        self.listener.launch(batch)

    def _on_idle(self) -> None:
        if self.is_fully_idle():
            self.ratio = self.ratio_init

    # -- passes known in advance --------------------------------------------------------
    def quiet_decode_passes(self, limit: int) -> int:
        """How many of the next passes (at most ``limit``) are known to decode the running
        batch and nothing else: no chunked request, nothing admitted (an empty queue, or the
        ``batch_is_full`` latch), the last pass decoded this batch, no request's next output
        finishes it (its result would release KV), and every pass's KV fits the free pages
        or what evicting the radix cache frees (else it would retract). 0: none."""
        running, last = self.running, self.last_batch
        reqs = running.reqs
        if not reqs or self.chunked_req is not None or last is not running:
            return 0
        if self.waiting and (not running.batch_is_full or self.config.priority_preemption):
            return 0
        steps = limit
        for r in reqs:
            left = r.max_new_tokens - r.output_len - 1
            if left < steps:
                steps = left
                if steps <= 0:
                    return 0
        pool, page, bs = self.pool, self.pool.page, len(reqs)
        room = pool.free_pages + self.tree.evictable_size // page  # pages free or freeable
        if page == 1:
            fitting = room // bs
            return steps if steps < fitting else fitting
        grow = self.decode_pages(steps)
        fitting = 0
        while fitting < steps and room >= bs:
            room -= grow[fitting % page]
            fitting += 1
        return fitting

    def decode_pages(self, steps: int) -> list[int]:
        """The pages each of the next ``min(steps, page)`` decode passes of the running batch
        takes (the counts repeat with the page size)."""
        page, reqs = self.pool.page, self.running.reqs
        if page == 1:  # every request takes a page each pass
            return [len(reqs)] if steps > 0 else []
        by_offset = [0] * page  # the requests by their committed length's offset in its page
        for r in reqs:
            by_offset[r.kv_committed % page] += 1
        return [by_offset[-j % page] for j in range(min(steps, page))]

    def skip_decode_passes(self, steps: int, end_us: float, last_start_us: float) -> None:
        """Take ``steps`` quiet decode passes at once (:meth:`quiet_decode_passes`), the
        last running from ``last_start_us`` to ``end_us``: every running request gets
        ``steps`` more tokens and KV slots, the pages are taken (the radix cache evicted
        where a pass would evict), the ratio decays ``steps`` times. The tokens come from
        the passes before the last (and the last decode's results, processed first, which
        the listener hears of) in the overlap loop, else from all of them; the queued
        result then stands for the last pass."""
        reqs, pool = self.running.reqs, self.pool
        page, bs = pool.page, len(reqs)
        if page == 1:
            left = steps
            while left:  # as many passes as the free slots hold, then evict for the next
                fit = pool.free_pages // bs
                if not fit:
                    pool.make_room(bs)
                    continue
                n = fit if fit < left else left
                pool.take_pages(n * bs)
                left -= n
        else:
            grow = self.decode_pages(steps)
            for j in range(steps):
                pool.make_room(bs * page)
                pool.take_pages(grow[j % page])
        passes = self.forward_ct
        queue = self.result_queue
        if queue:  # (overlap) the last decode's results, then those of all but the last pass
            head = queue[0]
            previous, fresh, late = head.ct - 1, 0, []
            for r in reqs:  # (each one's token from ``head``, as :meth:`_emit` counts it)
                before = r.last_token_us
                if before is None:
                    continue
                if r.last_token_ct == previous:
                    fresh += 1
                else:
                    late.append(before)
            head.gaps += fresh
            if late:
                head.late = late if head.late is None else head.late + late
            if head.gaps or head.late:
                self.listener.emitted(head)
            last_ct, last_us = passes + steps - 1, last_start_us
            head.ct, head.start_us, head.end_us = passes + steps, last_start_us, end_us
            head.gaps, head.late = 0, None
        else:
            last_ct, last_us = passes + steps, end_us
        for r in reqs:
            r.kv_allocated += steps
            r.kv_committed += steps
            r.output_len += steps
            r.last_token_ct, r.last_token_us = last_ct, last_us
        ratio, decay, low = self.ratio, self.ratio_decay, self.ratio_min
        for _ in range(steps):
            if ratio <= low:
                ratio = low
                break
            ratio = max(ratio - decay, low)
        self.ratio = ratio
        if self.waiting:
            self.stops["batch_is_full"] = self.stops.get("batch_is_full", 0) + steps
        self.forward_ct += steps
        self.running.end_us = end_us

    # -- get_next_batch_to_run ----------------------------------------------------------
    def _next_batch(self) -> Batch | None:
        exclude: set[Req] = set()
        chunked = self.chunked_req
        if chunked is not None:
            exclude.add(chunked)
            if chunked.extend_end > chunked.prefix_len:
                self._checkpoint(chunked, chunked.extend_end)
                chunked.prefix_len = chunked.extend_end
        running, last = self.running, self.last_batch
        if last is not None and last.is_extend:
            if last.chunked is not None:
                exclude.add(last.chunked)
            before = len(last.reqs)
            last.filter(exclude)
            if len(last.reqs) < before:
                running.batch_is_full = False
            if last.reqs and last is not running:
                if not running.reqs:
                    running = last
                else:
                    running.reqs = running.reqs + last.reqs
        before = len(running.reqs)
        running.filter()
        if len(running.reqs) < before:
            running.batch_is_full = False
        new_batch, running = self._new_prefill_batch(running)
        self.running = running
        if new_batch is not None:
            return new_batch
        if running.reqs:
            decode = self._update_running_batch(running)
            if decode is not None and decode.reqs:
                return decode
        return None

    def _allocatable(self, running_bs: int, held_rows: int = 0) -> int:
        budget = self.config.max_running_requests - running_bs
        rows = max(self.pool.free_rows + held_rows, 0)
        return budget if budget < rows else rows

    # -- get_new_batch_prefill ----------------------------------------------------------
    def _new_prefill_batch(self, running: Batch) -> tuple[Batch | None, Batch]:
        preemption = self.config.priority_preemption
        if preemption or not running.reqs:
            running.batch_is_full = False
        chunked = self.chunked_req
        if (running.batch_is_full or not self.waiting) and chunked is None:
            if self.waiting:
                self._stopped("batch_is_full")
            return None, running
        running_bs = len(running.reqs)
        if self._allocatable(running_bs) <= 0 and chunked is None and not preemption:
            running.batch_is_full = True
            self._stopped("max_running_requests")
            return None, running
        self._order_queue()
        c = self.config
        mixed = c.is_mixed_chunk
        adder = PrefillAdder(
            self.pool, running, self.ratio, c.max_prefill_tokens,
            c.chunked_prefill_size, running_bs if mixed else 0,
        )  # fmt: skip
        adder.preempt = self._preempt_running
        adder.cp_limit = c.cp_limit
        adder.load_back_threshold = c.load_back_threshold
        if chunked is not None:
            chunked.refresh_fill()
            if self.order == SHORTEST_PREFILL:
                adder.chunked_req_limit = self._shortest_prefill_chunk_limit(
                    chunked, adder.rem_chunk or 0
                )
            self.chunked_req = chunked = adder.add_chunked_req(chunked)
        adder.one_chunked = self.order == SHORTEST_PREFILL and chunked is not None
        scanned_from = len(adder.can_run)  # (the chunked request, not a waiting one, before)
        self._scan(adder, running)
        can_run = adder.can_run
        if not can_run:
            self._requeue_preempted(adder)
            return None, running
        # The scan admits the queue's head in order: each candidate it admits is the next
        # waiting request, and the first it does not admit ends it.
        del self.waiting[: len(can_run) - scanned_from]
        self._requeue_preempted(adder)
        if adder.new_chunked is not None:
            self.chunked_req = chunked = adder.new_chunked
        if chunked is not None:
            chunked.inflight_middle_chunks += 1
        batch = Batch(list(can_run))
        self._prepare_extend(batch)
        if mixed and running.reqs:
            finishing = self._finishing_inflight(running)
            running.filter(finishing)
            if finishing:
                running.batch_is_full = False
            if running.reqs and self._decode_fits(running.reqs):
                self._prepare_decode(running.reqs)
                for r in running.reqs:
                    r.refresh_fill()
                    r.extend_end = r.kv_committed
                batch.mode = MIXED
                batch.decoding = running.reqs
                batch.extend_num_tokens += len(running.reqs)
                batch.reqs = batch.reqs + running.reqs
                running = Batch([], running.batch_is_full)
        return batch, running

    def _scan(self, adder: PrefillAdder, running: Batch) -> None:
        """The waiting queue through the adder, in order, until a verdict stops it."""
        for req in self.waiting:
            if adder.budget_state() == OTHER:
                self._stopped(adder.stop)
                break
            held = sum(1 for r in adder.can_run if r.holds_row)
            if len(adder.can_run) >= self._allocatable(len(running.reqs), held):
                running.batch_is_full = True
            c = self.config
            if running.batch_is_full and not (
                c.priority_preemption
                and adder.preempt_to_schedule(
                    req, c.priority_scheduling_preemption_threshold, c.priority_sign
                )
            ):
                self._stopped("max_running_requests")
                break
            req.refresh_fill()
            found = self.tree.match_tiers(req.fill, len(req.fill) - 1)
            req.prefix_len, req.last_node = found.device, found.device_node
            req.host_hit, req.best_node = found.host, found.node
            req.protected_len = req.prefix_len
            verdict = adder.add_one_req(req)
            if verdict != CONTINUE:
                if verdict == NO_TOKEN:
                    running.batch_is_full = bool(adder.can_run) or bool(running.reqs)
                self._stopped(adder.stop)
                break

    def _preempt_running(self, req: Req, remaining: int) -> None:
        """A running request gives way to a higher-priority one (``release_req``)."""
        self._release(req, checkpoint=False)
        self.pool.make_room(remaining * self.config.retract_decode_steps)
        req.reset_for_retract()

    def _requeue_preempted(self, adder: PrefillAdder) -> None:
        for req in adder.preempted:
            self._enqueue(req)
            self.listener.preempted(req)

    def _stopped(self, why: str | None) -> None:
        if why is not None:
            self.stops[why] = self.stops.get(why, 0) + 1

    def _order_queue(self) -> None:
        """``calc_priority``: the queue's order. A cache-aware policy (``lpm``, ``hrrn``; with
        the radix cache on, else ``fcfs``; ``fcfs`` too above 128 waiting) matches every
        waiting request in the tree (:meth:`_match_waiting`) and sorts: ``lpm`` by the longest
        match, ``hrrn`` by the response ratio ``waited / uncached`` (tokens prefilled since
        the request joined the queue, over its prompt tokens not matched; none uncached
        first; ties by ``rid``), ``shortest-prefill-first`` (never ``fcfs``) by the tokens left
        to prefill (prompt and outputs not matched, at least 1), then by when the request
        joined the queue; requests deferred by the in-batch prefix check last; ``dfs-weight``
        (never ``fcfs``) by a walk of the tree, heavier subtrees first
        (:func:`~cpkv.sglang.radix.dfs_weight_order`). ``random`` shuffles the queue with the
        loop's own seeded generator. With a
        cache-agnostic order, every 32nd call the prefixes of the first 128 waiting requests
        are touched in the tree, the head last, so that LRU eviction takes them in reverse
        queue order."""
        waiting, c, tree = self.waiting, self.config, self.tree
        sign = c.priority_sign
        policy = self.order
        if policy in CACHE_AWARE:
            if policy not in FCFS_WHEN_LONG or len(waiting) <= WAITING_QUEUE_PREFIX_MATCH_MAX:
                self._sort_cache_aware(policy, waiting)
                return
        elif policy == "random":
            self.rng.shuffle(waiting)
        elif policy == "lof":
            if c.enable_priority_scheduling:
                waiting.sort(key=lambda r: (r.priority * sign, -r.max_new_tokens))
            else:
                waiting.sort(key=lambda r: -r.max_new_tokens)
        elif c.enable_priority_scheduling:
            waiting.sort(key=lambda r: (r.priority * sign, r.queue_entry))
        if tree.disabled or not waiting:
            return
        calls = self.prefix_touches
        self.prefix_touches = calls + 1
        if calls % WAITING_PREFIX_REFRESH_INTERVAL:
            return
        for r in reversed(waiting[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
            r.refresh_fill(mark=False)
            tree.match(r.fill, len(r.fill))

    def _sort_cache_aware(self, policy: str, waiting: list[Req]) -> None:
        """A cache-aware order (:meth:`_order_queue`), in place; the sorts are stable."""
        matched, deferred = self._match_waiting(waiting, in_batch=policy != "dfs-weight")
        keys: list[Any]
        if policy == "dfs-weight":
            order = dfs_weight_order(self.tree.root, [r.last_node for r in waiting])
            waiting[:] = [waiting[i] for i in order]
            return
        if policy == "lpm":
            keys = [INF if late else -m for m, late in zip(matched, deferred, strict=True)]
        elif policy == SHORTEST_PREFILL:
            keys = []
            for r, m, late in zip(waiting, matched, deferred, strict=True):
                r.matched_len = m
                keys.append((late, prefill_work(r), r.queue_entry))
        else:
            processed, keys = self.processed_tokens, []
            for r, m, late in zip(waiting, matched, deferred, strict=True):
                uncached = r.prompt_len - m
                if late:
                    keys.append((INF, r.rid))
                elif uncached <= 0:
                    keys.append((-INF, r.rid))
                else:
                    waited = processed - r.arrival_processed_tokens
                    keys.append((-((waited if waited > 0 else 0) / uncached), r.rid))
        order = sorted(range(len(waiting)), key=keys.__getitem__)
        waiting[:] = [waiting[i] for i in order]

    def _shortest_prefill_chunk_limit(self, chunked: Req, budget: int) -> int | None:
        """``shortest_prefill_chunk_limit``: the chunked request's next chunk leaves room for
        the queue's head requests (sorted) whose prefill is shorter than what it has left,
        whole pages each, while they fit in ``budget`` less a page (None: no cap)."""
        page = self.pool.page
        if budget < 2 * page:
            return None
        remaining = len(chunked.fill) - chunked.prefix_len
        reserved = 0
        for r in self.waiting:
            work = prefill_work(r)
            charge = -(-work // page) * page
            if work >= remaining or reserved + charge > budget - page:
                break
            reserved += charge
        if not reserved:
            return None
        return (budget - reserved) // page * page

    def _match_waiting(
        self, waiting: list[Req], in_batch: bool = True
    ) -> tuple[list[int], list[bool]]:
        """``_compute_prefix_matches``: each request matched in the tree in queue order
        (whole prompt + outputs; it takes the match as its prefix): its matched tokens (at
        most all but one); one whose prefix is at most 32 tokens is matched among the waiting
        requests checked before it (a tree of their tokens) and deferred when it shares at
        least 32 with one, else joins that tree (``in_batch`` False skips that check, which
        ``dfs-weight`` never reads)."""
        tree = self.tree
        checked = RadixTree(1, False, lambda tokens: None)
        matched: list[int] = []
        deferred: list[bool] = []
        for r in waiting:
            r.refresh_fill(mark=False)
            tokens = r.fill
            found = tree.match_tiers(tokens, len(tokens))
            r.prefix_len, r.last_node = found.device, found.device_node
            r.host_hit, r.best_node = found.host, found.node
            r.protected_len = r.prefix_len
            matched.append(min(found.device + found.host, len(tokens) - 1))
            late = False
            if in_batch and r.prefix_len <= IN_BATCH_PREFIX_CHECK:
                shared, _ = checked.match(tokens, len(tokens))
                if shared >= IN_BATCH_PREFIX_DEPRIORITIZE:
                    late = True
                else:
                    checked.insert(tokens, 0)
            deferred.append(late)
        return matched, deferred

    def _prepare_extend(self, batch: Batch) -> None:
        """Rows and KV slots for the batch's extends (``prepare_for_extend``)."""
        batch.mode = PREFILL
        pool, page = self.pool, self.pool.page
        tokens = pages = 0
        for r in batch.reqs:
            batch.rows.append((r, r.prefix_len, r.extend_end - r.prefix_len, r.host_loaded))
            r.host_loaded = 0
            tokens += r.extend_end - r.prefix_len
            pages += -(-r.extend_end // page) - (-(-r.prefix_len // page))
            if not r.holds_row:
                r.holds_row = True
                pool.free_rows -= 1
        batch.extend_num_tokens = tokens
        pool.make_room(tokens if page == 1 else tokens + len(batch.reqs) * page)
        pool.take_pages(pages)
        for r in batch.reqs:
            r.kv_allocated = r.kv_committed = r.extend_end
            r.is_retracted = False

    # -- update_running_batch -------------------------------------------------------------
    def _update_running_batch(self, batch: Batch) -> Batch | None:
        initial = len(batch.reqs)
        finishing = self._finishing_inflight(batch)
        if finishing:  # (the finished ones left the batch before the prefill attempt)
            batch.filter(finishing)
        if not batch.reqs:
            batch.batch_is_full = False
            return batch
        fits = self._decode_fits(batch.reqs)
        if not fits and finishing:
            batch.batch_is_full = False
            return None
        if not fits:
            self._retract(batch)
        else:
            self.ratio = max(self.ratio - self.ratio_decay, self.ratio_min)
        if len(batch.reqs) < initial:
            batch.batch_is_full = False
        if not batch.reqs:
            return batch
        self._prepare_decode(batch.reqs)
        batch.mode = DECODE
        batch.rows = []
        batch.decoding = None
        return batch

    def _finishing_inflight(self, batch: Batch) -> list[Req]:
        """Overlap loop: the requests whose queued result gives them their last token."""
        if not self.config.overlap or not self.result_queue:
            return []
        queued = self.result_queue[0].reqs
        return [r for r in batch.reqs if r.next_output_finishes() and r in queued]

    def _decode_need(self, reqs: list[Req]) -> int:
        page = self.pool.page
        if page == 1:
            return len(reqs)
        return sum(1 for r in reqs if r.kv_committed % page == 0) * page

    def _decode_fits(self, reqs: list[Req]) -> bool:
        """``check_decode_mem``: the next decode step's slots, after evicting for them."""
        need = self._decode_need(reqs)
        self.pool.make_room(need)
        return self.pool.available() >= need

    def _prepare_decode(self, reqs: list[Req]) -> None:
        pool, page = self.pool, self.pool.page
        pool.make_room(len(reqs) * page)
        pool.take_pages(self._decode_need(reqs) // page)
        for r in reqs:
            r.kv_allocated += 1
            r.kv_committed += 1

    def _retract(self, batch: Batch) -> None:
        """``retract_decode``: requests back to the queue until the next step fits (at least
        one; never the last), the ratio re-estimated from those left."""
        reqs, c = batch.reqs, self.config
        if c.retraction_policy == "priority":
            low = sys.maxsize if c.schedule_low_priority_values_first else -sys.maxsize - 1

            def key(i: int) -> tuple[int, ...]:
                r = reqs[i]
                priority = low if r.priority is None else r.priority
                return (priority * -c.priority_sign, r.output_len, -r.prompt_len)
        else:

            def key(i: int) -> tuple[int, ...]:
                return (reqs[i].output_len, -reqs[i].prompt_len)

        order = sorted(range(len(reqs)), key=key, reverse=True)
        retracted = []
        first = True
        while first or not self._decode_fits([reqs[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            req = reqs[order.pop()]
            held = req.kv_committed
            self._release(req, checkpoint=False)
            self.pool.make_room(len(order) * self.config.retract_decode_steps)
            req.reset_for_retract()
            retracted.append((req, held))
        if len(order) <= 1 and not self._decode_fits([reqs[i] for i in order]):
            raise RuntimeError("out of KV memory with one request left: SGLang aborts it")
        batch.reqs = [reqs[i] for i in order]
        kept = batch.reqs
        decoded = sum(r.output_len for r in kept)
        asked = sum(r.max_new_tokens for r in kept)
        steps = self.config.retract_decode_steps
        self.ratio = min(1.0, (decoded + steps * len(kept)) / (asked + 1))
        for req, held in retracted:
            self._enqueue(req)
            self.listener.retracted(req, held)

    # -- the tree and the pool around a request -------------------------------------------
    def _checkpoint(self, req: Req, up_to: int) -> None:
        """``checkpoint_into_tree``: the computed tokens up to ``up_to`` enter the tree; the
        request's lock moves to the node they end on; duplicates of what the tree held are
        freed."""
        tree = self.tree
        if tree.disabled:
            return
        duplicates, length, node = tree.insert(
            req.fill[:up_to], req.protected_len, req.inserted_len
        )
        if length == 0:
            return
        self.pool.free_tokens(duplicates)
        req.inserted_len = max(req.inserted_len, length)
        prompt = req.prompt_len // self.pool.page * self.pool.page
        if 0 < prompt < length:
            tree.insert(req.fill[:prompt], prompt, prompt)
        if req.lock is not None:
            tree.unlock(req.lock)
        tree.lock(node)
        req.lock = node
        req.protected_len = length
        req.last_node = node

    def _release(self, req: Req, checkpoint: bool) -> None:
        """``release_kv_cache``: (the tree takes the computed tokens,) the request's own slots
        and its row are freed, its lock released."""
        owned = req.kv_committed
        if checkpoint:
            req.refresh_fill()
            self._checkpoint(req, owned)
        page = self.pool.page
        self.pool.free_pages += -(-owned // page) - req.protected_len // page
        if req.lock is not None:
            self.tree.unlock(req.lock)
            req.lock = None
        if req.holds_row:
            req.holds_row = False
            self.pool.free_rows += 1

    # -- results -------------------------------------------------------------------------
    def _process(self, batch: Batch) -> None:
        if batch.mode == DECODE:
            self._process_decode(batch)
        else:
            self._process_extend(batch)
        if batch.gaps or batch.late:
            self.listener.emitted(batch)

    def _emit(self, reqs: list[Req], batch: Batch) -> list[Req]:
        """Each of ``reqs`` takes its output token from ``batch``; those it finished, in
        order."""
        finished = []
        previous, end_us, ct = batch.ct - 1, batch.end_us, batch.ct
        for req in reqs:
            req.output_len += 1
            before = req.last_token_us  # its gap: counted, or the time of the token before kept
            if before is not None and req.last_token_ct == previous:
                batch.gaps += 1
            elif before is not None:
                if batch.late is None:
                    batch.late = [before]
                else:
                    batch.late.append(before)
            req.last_token_us, req.last_token_ct = end_us, ct
            if req.output_len == 1:
                self.listener.first_token(req, batch)
            if req.output_len >= req.max_new_tokens:
                req.finished = True
                finished.append(req)
        return finished

    def _process_extend(self, batch: Batch) -> None:
        taking = []  # the requests that take a token (a middle chunk's does not)
        for req in batch.reqs:
            if (req.finished and req.inflight_middle_chunks <= 0) or req.is_retracted:
                continue
            if req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1
                continue
            taking.append(req)
        self._emit(taking, batch)
        decoding = batch.decoding or ()
        for req in taking:
            if req.finished:
                self._release(req, checkpoint=True)
                self.listener.finished(req, batch)
            elif req not in decoding:
                self._checkpoint(req, req.extend_end)
                req.prefix_len = req.extend_end

    def _process_decode(self, batch: Batch) -> None:
        reqs = batch.reqs
        if self.config.overlap:
            reqs = [r for r in reqs if not (r.finished or r.is_retracted)]
        for req in self._emit(reqs, batch):
            self._release(req, checkpoint=True)
            self.listener.finished(req, batch)
