"""One SGLang PrefillAdder pass inside the serving loop (policy ``prefill_adder``).

The arithmetic is that of :class:`cpkv.admission.adder.PrefillAdderModel` (sglang 0.5.23
``add_chunked_req`` / ``add_one_req`` and the scan loop; a differential test checks that
both agree), with the serving loop's memory view:

* ``avail`` is the pool's free tokens; there is no evictable cache in the pool (the L1
  prefix cache is its own partition), so the memory check reads
  ``(L - D) + min(max_new left, 4096) + page < avail - total_offset``;
* every iteration is a mixed batch (``--enable-mixed-chunk``): the running decodes'
  ``mixed`` tokens start ``total_offset`` and ``current_offset`` and are taken off the
  compute and chunk budgets;
* an L2 hit is loaded back (all of it) when it is at least ``load_back_threshold`` tokens;
  the pool always has room for it, since the memory check counts it.

Candidates are pulled from the queue one at a time, so that only the requests the scan
examines are looked up in the prefix cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from cpkv.admission.budgets import cp_limit_broken
from cpkv.workload.request import CLIP_MAX_NEW_TOKENS, ceil_page

NO_CAP = 1 << 62


@dataclass(frozen=True)
class AdderBudgets:
    """The PrefillAdder knobs the serving loop reads (from the ``admit`` block)."""

    page: int
    max_prefill_tokens: int
    chunk_tokens: int | None
    max_running_requests: int | None = None
    prefill_max_requests: int | None = None
    load_back_threshold: int = 10
    cp_max_batch_requests: int | None = None
    cp_max_total_extend_tokens: int | None = None
    cp_max_total_cached_tokens: int | None = None

    @cached_property
    def cp_on(self) -> bool:
        """Whether a CP shared-KV limit applies (cpkv's own limits, not upstream SGLang)."""
        return (
            self.cp_max_batch_requests is not None
            or self.cp_max_total_extend_tokens is not None
            or self.cp_max_total_cached_tokens is not None
        )

    @cached_property
    def load_threshold(self) -> int:
        """The smallest host hit that is loaded back (at least 1 token)."""
        return max(1, self.load_back_threshold)

    @cached_property
    def lone_limits(self) -> tuple[int, int, int | None, int | None, int | None, int]:
        """What :func:`lone_pass` reads: page, max_prefill_tokens, chunk_tokens,
        max_running_requests, prefill_max_requests, load_threshold."""
        return (
            self.page, self.max_prefill_tokens, self.chunk_tokens, self.max_running_requests,
            self.prefill_max_requests, self.load_threshold,
        )  # fmt: skip


class Candidate(NamedTuple):
    """A waiting request as the pass sees it: fill length ``L``, device prefix and host hit
    (both page aligned), ``max_new`` left and ``max_new`` as first asked (both clipped).
    The loop hands the pass plain tuples of these five numbers, in this order."""

    fill_tokens: int
    device_prefix: int
    host_hit: int
    max_new_left: int
    max_new_tokens: int


@dataclass(slots=True)
class PassResult:
    """What one pass decided.

    ``chunk_tokens``: tokens of the continuing chunked request this iteration (0: none),
    ``chunk_done``: it finished its prompt. ``admitted``: ``(extend, loaded, cut)`` for the
    first ``len(admitted)`` candidates. ``stop``: the budget that ended the scan (None: the
    queue ran out).
    """

    chunk_tokens: int = 0
    chunk_done: bool = False
    admitted: list[tuple[int, int, bool]] | None = None
    stop: str | None = None


def adder_pass(
    free_tokens: int,
    mixed_tokens: int,
    headroom: float,
    running: int,
    budgets: AdderBudgets,
    chunk: tuple[int, int, int] | None,
    queue: Iterator[Candidate],
) -> PassResult:
    """One scheduling pass over the waiting queue.

    ``free_tokens`` are the pool's free token slots, ``mixed_tokens`` the running decodes'
    tokens of this mixed batch, ``headroom`` the running requests'
    ``sum(min(max_new left, 4096)) * ratio``; ``chunk`` is ``(tokens left, max_new, tokens
    before the chunk)`` of the request being chunked; ``max_new`` values arrive clipped to
    4096.

    The rules are those of :meth:`cpkv.admission.adder.PrefillAdderModel.run_pass`, which
    says why the two loops are not one; the CP check is the shared
    :func:`cpkv.admission.budgets.cp_limit_broken`. Page rounding is
    :func:`~cpkv.workload.request.ceil_page`, inline (``-(-x // page) * page``) where it runs
    once per candidate."""
    page = budgets.page
    room = free_tokens
    total_offset = mixed_tokens + headroom
    current_offset = mixed_tokens
    rem_input = budgets.max_prefill_tokens - mixed_tokens
    rem_chunk = None if budgets.chunk_tokens is None else budgets.chunk_tokens - mixed_tokens
    admitted: list[tuple[int, int, bool]] = []
    stop: str | None = None
    chunk_tokens, chunk_done = 0, False
    batch_requests = 0
    cp_on = budgets.cp_on
    extend_paged_sum = cached_paged_sum = 0
    if chunk is not None and rem_chunk is not None:  # add_chunked_req
        tokens_left, max_new, prefix = chunk
        chunk_limit = min(rem_chunk, int(room - total_offset))
        if chunk_limit <= 0:
            chunk_limit = rem_chunk
        if chunk_limit > 0:
            cut = tokens_left > chunk_limit
            extend = chunk_limit if cut else tokens_left
            extend_paged = ceil_page(extend, page)
            total_offset += extend_paged + page + (0 if cut else max_new)
            current_offset += extend_paged + page
            rem_input -= extend_paged
            rem_chunk -= extend_paged
            chunk_tokens, chunk_done = extend, not cut
            extend_paged_sum, cached_paged_sum = extend_paged, ceil_page(prefix, page)
            batch_requests = 1
    max_running = (
        NO_CAP if budgets.max_running_requests is None else budgets.max_running_requests - running
    )
    prefill_max_requests = (
        NO_CAP if budgets.prefill_max_requests is None else budgets.prefill_max_requests
    )
    load_threshold = budgets.load_threshold
    first = True
    while stop is None:
        candidate = next(queue, None)
        if candidate is None:
            break
        if first and room - total_offset > 0 and room - current_offset > 0:
            # budget_state() at the top of the scan
            if rem_input <= 0:
                stop = "rem_input_tokens"
            elif rem_chunk is not None and rem_chunk <= 0:
                stop = "rem_chunk_tokens"
            if stop is not None:
                break
        first = False
        if batch_requests >= max_running:
            stop = "max_running_requests"
            break
        if batch_requests >= prefill_max_requests:
            stop = "prefill_max_requests"
            break
        fill, device, host, max_new_left, max_new_asked = candidate
        # memory: (L - D) + min(max_new left, 4096) + page < rem_total
        if not fill - device + max_new_left + page < room - total_offset:
            stop = "rem_total_tokens"
            break
        # select with the host hit; a hit below the threshold is declined: select again without
        for loaded in (host, 0) if 0 < host < load_threshold else (host,):
            prefix = device + loaded
            extend = fill - prefix
            extend_paged = -(-extend // page) * page
            cut = False
            if rem_chunk is None:
                if batch_requests and extend_paged >= rem_input:
                    stop = "rem_input_tokens"
                    break
            elif extend_paged > rem_chunk:
                extend_paged = extend = rem_chunk // page * page
                if extend <= 0:
                    stop = "rem_chunk_tokens"
                    break
                cut = True
            if cp_on and batch_requests:
                stop = cp_limit_broken(
                    batch_requests + 1,
                    extend_paged_sum + extend_paged,
                    cached_paged_sum + prefix,
                    budgets.cp_max_batch_requests,
                    budgets.cp_max_total_extend_tokens,
                    budgets.cp_max_total_cached_tokens,
                )
                if stop is not None:
                    break
        if stop is not None:
            break
        room -= loaded
        total_offset += extend_paged + page + (0 if cut else max_new_asked)
        current_offset += extend_paged + page
        rem_input -= extend_paged
        if rem_chunk is not None:
            rem_chunk -= extend_paged
        extend_paged_sum += extend_paged
        cached_paged_sum += prefix
        batch_requests += 1
        admitted.append((extend, loaded, cut))
        # budget_state(): stops the scan, the request stays admitted
        if room - total_offset <= 0:
            stop = "rem_total_tokens"
        elif room - current_offset <= 0:
            stop = "cur_rem_tokens"
        elif rem_input <= 0:
            stop = "rem_input_tokens"
        elif rem_chunk is not None and rem_chunk <= 0:
            stop = "rem_chunk_tokens"
    return PassResult(chunk_tokens, chunk_done, admitted, stop)


def lone_pass(
    free_tokens: int,
    mixed_tokens: int,
    headroom: float,
    running: int,
    limits: tuple[int, int, int | None, int | None, int | None, int],
    fill: int,
    device: int,
    host: int,
    max_new_left: int,
    max_new_asked: int,
) -> tuple[int, int, str | None] | None:
    """:func:`adder_pass` for a queue of one candidate (its fill, device prefix, host hit,
    max_new left and as asked: a :class:`Candidate`'s fields) and no chunked request, when
    the candidate is admitted whole: ``(extend, loaded, stop)``; None when it is not
    (stopped, or cut into a chunk: the caller runs :func:`adder_pass`). ``limits``:
    :attr:`AdderBudgets.lone_limits`. The same arithmetic, in the same order, for that one
    case (a test checks both agree on random passes)."""
    page, max_prefill, chunk, max_running, prefill_max, load_threshold = limits
    total_offset = mixed_tokens + headroom
    rem_input = max_prefill - mixed_tokens
    rem_chunk = None if chunk is None else chunk - mixed_tokens
    room = free_tokens
    if room - total_offset > 0 and room - mixed_tokens > 0:  # budget_state() at the top
        if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
            return None
    if max_running is not None and max_running - running <= 0:
        return None
    if prefill_max is not None and prefill_max <= 0:
        return None
    if not fill - device + max_new_left + page < room - total_offset:
        return None
    loaded = 0 if 0 < host < load_threshold else host  # a declined hit is not loaded
    extend = fill - device - loaded
    extend_paged = -(-extend // page) * page
    if rem_chunk is not None and extend_paged > rem_chunk:
        return None  # cut (with the hit or without it: without it needs more)
    room -= loaded
    total_offset += extend_paged + page + max_new_asked
    current_offset = mixed_tokens + extend_paged + page
    rem_input -= extend_paged
    if room - total_offset <= 0:  # budget_state() after the admission
        stop: str | None = "rem_total_tokens"
    elif room - current_offset <= 0:
        stop = "cur_rem_tokens"
    elif rem_input <= 0:
        stop = "rem_input_tokens"
    elif rem_chunk is not None and rem_chunk - extend_paged <= 0:
        stop = "rem_chunk_tokens"
    else:
        stop = None
    return extend, loaded, stop


def adder_step(sim: Any, decoded: int) -> None:
    """Admission and prefill of one iteration for policy ``prefill_adder`` (on a
    :class:`~cpkv.serving.loop.Sim`): one pass, then its decisions applied."""
    pool, chunked = sim.pool, sim.chunked
    chunk = None
    if chunked is not None:
        max_new = min(chunked.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        chunk = (chunked.fill_tokens - chunked.filled_tokens, max_new, chunked.filled_tokens)
    headroom = (  # pool.headroom_tokens(), inline
        pool.unclipped_finish_sum
        - pool.n_unclipped * pool.decode_steps
        + CLIP_MAX_NEW_TOKENS * pool.n_clipped
    ) * sim.ratio.current
    waiting = sim.waiting
    hits: list[tuple[int, int]] = []  # the hits the pass looked up, to admit with
    res = adder_pass(
        pool.free_blocks * sim.block_size,
        decoded,
        headroom,
        pool.n_running,
        sim.settings.adder,
        chunk,
        _candidates(sim, hits) if waiting else iter(()),
    )
    completed = sim.completed
    if res.chunk_tokens:
        extend = res.chunk_tokens
        sim.prefill_tokens += extend
        sim.prefill_context += chunked.filled_tokens + extend
        sim.prefill_attention_pairs += extend * chunked.filled_tokens + extend * (extend + 1) // 2
        chunked.filled_tokens += extend
        chunked.prefilled += extend
        if res.chunk_done:
            completed.append(chunked)
            sim.chunked = None
    admitted = res.admitted
    if admitted:
        admit = sim.admit
        prefill_tokens = prefill_context = pairs = 0
        for k, (extend, _loaded, cut) in enumerate(admitted):
            r = waiting[k]
            device, host = hits[k]
            admit(r, device, host, None)
            filled = r.filled_tokens
            prefill_tokens += extend
            prefill_context += filled + extend
            pairs += extend * filled + extend * (extend + 1) // 2
            r.filled_tokens = filled + extend
            r.prefilled += extend
            if cut:
                sim.chunked = r
            else:
                completed.append(r)
        sim.prefill_tokens += prefill_tokens
        sim.prefill_context += prefill_context
        sim.prefill_attention_pairs += pairs
        del waiting[: len(admitted)]
    if res.stop is not None:
        sim.stop_counts[res.stop] = sim.stop_counts.get(res.stop, 0) + 1


def _candidates(sim: Any, hits: list[tuple[int, int]]) -> Iterator[tuple[int, int, int, int, int]]:
    hit = sim.hit
    for r in sim.waiting:
        device, host = found = hit(r)
        hits.append(found)
        max_new = r.max_new_tokens
        left = max_new - r.generated
        yield (
            r.fill_tokens,
            device,
            host,
            left if left < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS,
            max_new if max_new < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS,
        )
