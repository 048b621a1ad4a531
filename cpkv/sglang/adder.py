"""SGLang 0.5.23's ``PrefillAdder`` as its scheduler loop builds it each pass (a full-attention
model, no host tier, no priority preemption).

Memory is read live: ``remaining_total = available + evictable - total_offset`` and
``remaining_current = available + evictable - current_offset``, where the offsets start at the
mixed batch's decode tokens; the running requests reserve ``min(max_new - output, 4096) x
ratio`` each in ``total_offset`` (ratio 1 for ``ignore_eos``). An admitted request reserves
``ceil_page(extend) + page`` now and its ``min(max_new, 4096)`` (0 for a cut chunk) later. A
candidate's memory check runs under a temporary lock of its matched prefix, so the prefix it
would reuse does not count as evictable; an admitted request keeps the lock.

``add_one_req`` (SGLang's order): the memory check ``extend + min(max_new - output, 4096) +
page < remaining_total`` (NO_TOKEN); without chunking, a request after the first whose paged
extend reaches ``rem_input_tokens`` stops the pass (OTHER); with chunking, a paged extend over
``rem_chunk_tokens`` is cut to whole pages of it (OTHER when nothing is left); then the commit
and ``budget_state()``. On top, cpkv's CP shared-KV limits (when the loop is given them; not
SGLang's): once the batch holds a request, a candidate whose admission would break one stops
the pass (OTHER), checked after its selection (a cut request counts its cut extend; its
prefix counts its host hit) and before any load-back.

With a host tier, a candidate's host hit counts as prefix in its selection; once selected it
is loaded back (:meth:`~cpkv.sglang.radix.RadixTree.load_back`: all of it, taking device slots
now) and the request locks the deeper node; a hit not loaded (below the threshold, no room)
is selected again without it.
``ignore_eos`` requests with the radix cache off take SGLang's own
path (``add_one_req_ignore_eos``): the whole batch's future growth is checked against the
current room, request by request in order of tokens left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from cpkv.sglang.config import CLIP_MAX_NEW_TOKENS as CLIP
from cpkv.sglang.config import IGNORE_EOS_RESERVE_TOKENS
from cpkv.sglang.memory import KvPool
from cpkv.sglang.radix import Match
from cpkv.sglang.request import Req

if TYPE_CHECKING:
    from cpkv.sglang.loop import Batch

CONTINUE: Final = "continue"
NO_TOKEN: Final = "no_token"
OTHER: Final = "other"


class PrefillAdder:
    """One pass's budgets and the requests it takes (see the module docstring)."""

    def __init__(
        self, pool: KvPool, running: Batch, ratio: float, max_prefill_tokens: int,
        chunked_prefill_size: int | None, mixed_decode_tokens: int,
    ) -> None:  # fmt: skip
        self.pool, self.tree, self.page = pool, pool.tree, pool.page
        self.batch = running  # the running batch (priority preemption takes from it)
        self.running, self.ratio = running.reqs, ratio
        self.rem_input = max_prefill_tokens - mixed_decode_tokens
        self.rem_chunk = (
            None if chunked_prefill_size is None else chunked_prefill_size - mixed_decode_tokens
        )
        total = float(mixed_decode_tokens)
        reservation = self._reservation
        for r in running.reqs:
            total += reservation(r)
        self.total_offset = total
        self.current_offset = mixed_decode_tokens
        self.can_run: list[Req] = []
        self.new_chunked: Req | None = None
        self.req_states: list[tuple[float, int]] | None = None
        self.stop: str | None = None  # the budget behind the last verdict that stopped a scan
        self.preempted: list[Req] = []  # running requests that gave way, in batch order
        self.preempt: Any = None  # releases a preempted request (req, requests left)
        # cpkv's CP shared-KV limits (None: off): (requests, extend sum, cached sum) -> the
        # limit broken or None; the sums are page-aligned, the continuing chunk included
        self.cp_limit: Any = None
        self.cp_extend = self.cp_cached = 0
        self.load_back_threshold = 10  # the host tier's smallest hit loaded back
        # shortest-prefill-first: a cap on the chunked request's next chunk (None: none), and
        # whether a chunked request continues, so that no second one is started
        self.chunked_req_limit: int | None = None
        self.one_chunked = False

    def _reservation(self, r: Req) -> float:
        """What a running request reserves: ``min(max_new - output, 4096) x ratio`` (ratio 1
        for ``ignore_eos``)."""
        left = r.max_new_tokens - r.output_len
        return (left if left < CLIP else CLIP) * (1.0 if r.ignore_eos else self.ratio)

    # -- the budgets ----------------------------------------------------------------------
    def _room(self) -> int:
        return self.pool.available() + self.tree.evictable_size

    def remaining_total(self) -> float:
        return self._room() - self.total_offset

    def remaining_current(self) -> float:
        return self._room() - self.current_offset

    def _ceil_page(self, tokens: int) -> int:
        return -(-tokens // self.page) * self.page

    def budget_state(self) -> str:
        """What the budgets say before the next candidate: NO_TOKEN (no memory), OTHER (a
        compute budget spent) or CONTINUE; ``stop`` names the budget."""
        room = self._room()
        if not (room - self.total_offset > 0 and room - self.current_offset > 0):
            self.stop = "rem_total_tokens"
            return NO_TOKEN
        if self.rem_input <= 0:
            self.stop = "rem_input_tokens"
            return OTHER
        if self.rem_chunk is not None and self.rem_chunk <= 0:
            self.stop = "rem_chunk_tokens"
            return OTHER
        return CONTINUE

    def _charge(self, extend: int, max_new: int, prefix: int = 0) -> None:
        paged = self._ceil_page(extend)
        self.cp_extend += paged
        self.cp_cached += self._ceil_page(prefix)
        now = paged + self.page
        self.total_offset += now + max_new
        self.current_offset += now
        self.rem_input -= paged
        if self.rem_chunk is not None:
            self.rem_chunk -= paged

    # -- the continuing chunk -------------------------------------------------------------
    def add_chunked_req(self, req: Req) -> Req | None:
        """The chunked request's next chunk; returns it while its prompt is not done."""
        rem = self.rem_chunk
        assert rem is not None
        limit = min(rem, int(self.remaining_total()))
        if limit <= 0:
            limit = rem
        if self.chunked_req_limit is not None and self.chunked_req_limit < limit:
            limit = self.chunked_req_limit
        left = len(req.fill) - req.prefix_len
        truncated = left > limit
        tokens = limit if truncated else left
        req.extend_end = req.prefix_len + tokens
        self.can_run.append(req)
        max_new = req.max_new_tokens
        self._charge(
            tokens, 0 if truncated else (max_new if max_new < CLIP else CLIP), req.prefix_len
        )
        return req if truncated else None

    # -- a waiting request ------------------------------------------------------------------
    def add_one_req(self, req: Req) -> str:
        """Try to admit ``req`` (its prefix matched); the verdict for the next candidate."""
        if req.ignore_eos and self.tree.disabled:
            return self._add_ignore_eos(req)
        left = req.max_new_tokens - req.output_len
        max_new = min(max(left, 0), CLIP)
        extend = len(req.fill) - req.prefix_len
        total_tokens = extend + max_new + self.page
        node = req.last_node
        self.tree.lock(node)  # (the candidate's own prefix is not evictable for it)
        try:
            verdict = self._select(req, total_tokens, req.host_hit)
            if isinstance(verdict, str):
                return verdict
            if self.cp_limit is not None and self.can_run:
                if self._cp_stops(req.prefix_len + req.host_hit, verdict[0]):
                    return OTHER
            if req.host_hit:
                verdict = self._load_back(req, total_tokens, verdict)
                if isinstance(verdict, str):
                    return verdict
            extend, max_new, chunked = verdict
            req.extend_end = req.prefix_len + extend
            self.tree.lock(req.last_node)
            req.lock = req.last_node
            self.can_run.append(req)
            if chunked:
                self.new_chunked = req
            self._charge(extend, max_new, req.prefix_len)
        finally:
            self.tree.unlock(node)
        return self.budget_state()

    def _load_back(
        self, req: Req, total_tokens: int, verdict: tuple[int, int, bool]
    ) -> tuple[int, int, bool] | str:
        """The host tier: ``req``'s host hit back onto the device (all of it; declined below
        the threshold or without room, then selected again without it)."""
        tree = self.tree
        found = Match(req.prefix_len, req.last_node, req.host_hit, req.best_node)
        loaded = tree.load_back(found, self.load_back_threshold, self.pool.take_for_load)
        if not loaded:
            return self._select(req, total_tokens, 0)
        req.prefix_len += loaded
        req.protected_len = req.prefix_len
        req.last_node = req.best_node
        req.host_loaded = loaded
        return verdict

    def _cp_stops(self, prefix: int, extend: int) -> bool:
        """cpkv's CP shared-KV limits (not SGLang's): whether admitting a request of this
        prefix and extend would break one (``stop`` names it)."""
        assert self.cp_limit is not None
        broken = self.cp_limit(
            len(self.can_run) + 1,
            self.cp_extend + self._ceil_page(extend),
            self.cp_cached + self._ceil_page(prefix),
        )
        if broken is None:
            return False
        self.stop = broken
        return True

    def _select(self, req: Req, total_tokens: int, host_hit: int) -> tuple[int, int, bool] | str:
        """``(extend, max_new reserved, cut)`` of ``req`` after its device prefix and
        ``host_hit``, or the verdict that refuses it."""
        prefix = req.prefix_len + host_hit
        extend = len(req.fill) - prefix
        paged = self._ceil_page(extend)
        if not total_tokens < self.remaining_total():
            self.stop = "rem_total_tokens"
            return NO_TOKEN
        if self.rem_chunk is None and self.can_run and paged >= self.rem_input:
            self.stop = "rem_input_tokens"
            return OTHER
        max_new = req.max_new_tokens
        max_new = max_new if max_new < CLIP else CLIP
        limit = self.rem_chunk
        if limit is not None and paged > limit:
            if self.one_chunked:  # shortest-prefill-first tracks one chunked request
                self.stop = "one_chunked_request"
                return OTHER
            extend = limit // self.page * self.page
            extend = (prefix + extend) // self.page * self.page - prefix
            if extend <= 0:
                self.stop = "rem_chunk_tokens"
                return OTHER
            return extend, 0, True
        return extend, max_new, False

    def _add_ignore_eos(self, req: Req) -> str:
        """SGLang's ``add_one_req_ignore_eos`` (radix cache off)."""
        extend = len(req.fill) - req.prefix_len
        paged = self._ceil_page(extend) + self.page
        if not paged <= min(self.remaining_current(), self.remaining_total()):
            self.stop = "rem_total_tokens"
            return NO_TOKEN
        if self.req_states is None:
            self.req_states = []
            self._add_state(req, False)
            for r in self.running:
                self._add_state(r, False)
            for r in self.can_run:
                self._add_state(r, False)
            self.req_states.sort(key=lambda state: state[0])
        else:
            self._add_state(req, True)
        room = self.remaining_current() - paged
        freed = 0
        states = self.req_states
        for i, (left, occupied) in enumerate(states):
            batch = len(states) - i
            if room + freed - left * batch <= IGNORE_EOS_RESERVE_TOKENS * batch:
                self.stop = "ignore_eos_reserve"
                return NO_TOKEN
            freed += occupied
        rem_chunk = self.rem_chunk
        cut = rem_chunk is not None and extend > rem_chunk
        if self.cp_limit is not None and self.can_run:
            if self._cp_stops(req.prefix_len, rem_chunk if cut else extend):  # type: ignore[arg-type]
                return OTHER
        if not cut:
            req.extend_end = len(req.fill)
            self.can_run.append(req)
            max_new = req.max_new_tokens
            self._charge(req.extend_len, max_new if max_new < CLIP else CLIP, req.prefix_len)
        else:
            assert rem_chunk is not None
            if rem_chunk <= 0:
                self.stop = "rem_chunk_tokens"
                return OTHER
            req.extend_end = req.prefix_len + rem_chunk
            self.can_run.append(req)
            self.new_chunked = req
            self._charge(rem_chunk, 0, req.prefix_len)
        return self.budget_state()

    def _add_state(self, r: Req, in_order: bool) -> None:
        ratio = 1.0 if r.ignore_eos else self.ratio
        left = r.max_new_tokens * ratio - r.output_len
        occupied = r.prompt_len + r.output_len
        if left <= 0:
            return
        states = self.req_states
        assert states is not None
        if not in_order:
            states.append((left, occupied))
            return
        i = 0
        for i in range(len(states)):  # (SGLang's insertion: past the end it lands before the last)
            if left <= states[i][0]:
                break
        states.insert(i, (left, occupied))

    # -- priority preemption --------------------------------------------------------------
    def preempt_to_schedule(self, req: Req, threshold: int, sign: int) -> bool:
        """``preempt_to_schedule``: running requests of lower priority (by at least
        ``threshold``; the lowest and latest queued first) give way to ``req`` when their
        reservations cover its shortfall (its extend + ``min(max_new, 4096)`` beyond the
        remaining total, read with its fill and prefix as last refreshed: a request never
        matched yet counts no fill); whether they did."""
        taken = set(self.preempted)
        candidates = sorted(
            (r for r in self.running if r not in taken and not r.finished),
            key=lambda r: (r.priority * -sign, -r.queue_entry),
        )
        max_new = req.max_new_tokens
        shortfall = (
            req.refreshed_len - req.prefix_len + (max_new if max_new < CLIP else CLIP)
            - self.remaining_total()
        )  # fmt: skip
        chosen = []
        for r in candidates:
            if (req.priority - r.priority) * -sign <= threshold:
                break
            chosen.append(r)
            shortfall -= self._reservation(r)
            if shortfall <= 0:
                break
        if not chosen or shortfall > 0:
            return False
        chosen_set = set(chosen)
        batch, kept, released = self.batch, [], 0
        order = []
        for r in batch.reqs:
            if r in chosen_set:
                self.total_offset -= self._reservation(r)
                released += 1
                self.preempt(r, len(batch.reqs) - released)
                order.append(r)
            else:
                kept.append(r)
        batch.reqs = kept
        self.running = kept
        self.preempted.extend(order)
        return True
