"""SGLang's PrefillAdder pass as the serving engine runs it (policy ``prefill_adder``).

The arithmetic is that of :class:`cpkv.admission.adder.PrefillAdderModel` (sglang 0.5.23
``add_chunked_req`` / ``add_one_req`` and the scan loop; a differential test checks that
both agree), with the serving engine's memory view:

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
from typing import Final, NamedTuple

from cpkv.admission.cp_limit import cp_limit_broken
from cpkv.workload.request import ceil_page

NO_CAP: Final = 1 << 62


@dataclass(frozen=True)
class AdderBudgets:
    """The PrefillAdder knobs the serving engine's pass reads (from the ``admit`` block)."""

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
    def slots_cap(self) -> int:
        """``max_running_requests`` (a number no batch reaches when unset)."""
        return NO_CAP if self.max_running_requests is None else self.max_running_requests

    @cached_property
    def prefill_cap(self) -> int:
        """``prefill_max_requests`` (a number no batch reaches when unset)."""
        return NO_CAP if self.prefill_max_requests is None else self.prefill_max_requests

    @cached_property
    def load_threshold(self) -> int:
        """The smallest host hit that is loaded back (at least 1 token)."""
        return max(1, self.load_back_threshold)


class Candidate(NamedTuple):
    """A waiting request as the pass sees it: fill length ``L``, device prefix and host hit
    (both page aligned), ``max_new`` left and ``max_new`` as first asked (both clipped).
    The scheduler hands the pass plain tuples of these five numbers, in this order."""

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
    queue: Iterator[tuple[int, int, int, int, int]],
) -> PassResult:
    """One scheduling pass over the waiting queue.

    ``free_tokens`` are the pool's free token slots, ``mixed_tokens`` the running decodes'
    tokens of this mixed batch, ``headroom`` the running requests'
    ``sum(min(max_new left, 4096)) * ratio``; ``chunk`` is ``(tokens left, max_new, tokens
    before the chunk)`` of the request being chunked; ``max_new`` values arrive clipped to
    4096.

    The rules are those of :meth:`cpkv.admission.adder.PrefillAdderModel.run_pass` (which
    says why the two loops are not one); the CP check is the shared
    :func:`cpkv.admission.cp_limit.cp_limit_broken`."""
    page = budgets.page
    admitted: list[tuple[int, int, bool]] = []
    stop: str | None = None
    cp_on = budgets.cp_on
    (
        room, total_offset, current_offset, rem_input, rem_chunk, chunk_tokens, chunk_done,
        batch_requests, extend_paged_sum, cached_paged_sum,
    ) = _start(free_tokens, mixed_tokens, headroom, budgets, chunk)  # fmt: skip
    max_running = budgets.slots_cap - running
    prefill_max_requests, load_threshold = budgets.prefill_cap, budgets.load_threshold
    first = True
    while stop is None:
        candidate = next(queue, None)
        if candidate is None:
            break
        if first:  # budget_state() at the top of the scan: only a spent compute budget stops
            state = budget_state(room - total_offset, room - current_offset, rem_input, rem_chunk)
            if state == "rem_input_tokens" or state == "rem_chunk_tokens":
                stop = state
                break
            first = False
        if batch_requests >= max_running:
            stop = "max_running_requests"
            break
        if batch_requests >= prefill_max_requests:
            stop = "prefill_max_requests"
            break
        fill, device, host, max_new_left, max_new_asked = candidate
        if not memory_tokens(fill - device, max_new_left, page) < room - total_offset:
            stop = "rem_total_tokens"
            break
        stop, loaded, extend, extend_paged, cut = _select(
            fill, device, host, load_threshold, page, rem_input, rem_chunk, batch_requests,
            extend_paged_sum, cached_paged_sum, budgets if cp_on else None,
        )  # fmt: skip
        if stop is not None:
            break
        room -= loaded
        total_offset += extend_paged + page + (0 if cut else max_new_asked)
        current_offset += extend_paged + page
        rem_input -= extend_paged
        if rem_chunk is not None:
            rem_chunk -= extend_paged
        extend_paged_sum += extend_paged
        cached_paged_sum += device + loaded
        batch_requests += 1
        admitted.append((extend, loaded, cut))
        # budget_state(): stops the scan, the request stays admitted
        stop = budget_state(room - total_offset, room - current_offset, rem_input, rem_chunk)
    return PassResult(chunk_tokens, chunk_done, admitted, stop)


def _start(
    free_tokens: int, mixed_tokens: int, headroom: float, budgets: AdderBudgets,
    chunk: tuple[int, int, int] | None,
) -> tuple[int, float, int, int, int | None, int, bool, int, int, int]:  # fmt: skip
    """The pass's budgets before its scan: the mixed batch's decode tokens taken off them,
    then ``add_chunked_req`` for the chunked request (``chunk``): ``(room, total_offset,
    current_offset, rem_input, rem_chunk, chunk tokens, chunk done, batch requests, extend
    paged sum, cached paged sum)``."""
    page = budgets.page
    total_offset = mixed_tokens + headroom
    rem_input = budgets.max_prefill_tokens - mixed_tokens
    rem_chunk = None if budgets.chunk_tokens is None else budgets.chunk_tokens - mixed_tokens
    if chunk is None or rem_chunk is None:
        return free_tokens, total_offset, mixed_tokens, rem_input, rem_chunk, 0, False, 0, 0, 0
    tokens_left, max_new, prefix = chunk
    extend = _chunk_tokens(tokens_left, rem_chunk, free_tokens - total_offset)
    if not extend:
        return free_tokens, total_offset, mixed_tokens, rem_input, rem_chunk, 0, False, 0, 0, 0
    cut = extend < tokens_left
    extend_paged = ceil_page(extend, page)
    return (
        free_tokens, total_offset + extend_paged + page + (0 if cut else max_new),
        mixed_tokens + extend_paged + page, rem_input - extend_paged, rem_chunk - extend_paged,
        extend, not cut, 1, extend_paged, ceil_page(prefix, page),
    )  # fmt: skip


def _select(
    fill: int, device: int, host: int, load_threshold: int, page: int, rem_input: int,
    rem_chunk: int | None, batch_requests: int, extend_paged_sum: int, cached_paged_sum: int,
    cp: AdderBudgets | None,
) -> tuple[str | None, int, int, int, bool]:  # fmt: skip
    """``add_one_req``'s selection of a candidate that passed the memory check: ``(stop,
    loaded, extend, extend_paged, cut)``. With its host hit; a hit below the threshold is
    declined: selected again without. ``cp``: the budgets when CP limits apply."""
    for loaded in (host, 0) if 0 < host < load_threshold else (host,):
        prefix = device + loaded
        extend = fill - prefix
        extend_paged = -(-extend // page) * page
        cut = False
        if rem_chunk is None:
            if batch_requests and extend_paged >= rem_input:
                return "rem_input_tokens", loaded, extend, extend_paged, cut
        elif extend_paged > rem_chunk:
            extend_paged = extend = rem_chunk // page * page
            if extend <= 0:
                return "rem_chunk_tokens", loaded, extend, extend_paged, cut
            cut = True
        if cp is not None and batch_requests:
            stop = cp_limit_broken(
                batch_requests + 1, extend_paged_sum + extend_paged, cached_paged_sum + prefix,
                cp.cp_max_batch_requests, cp.cp_max_total_extend_tokens,
                cp.cp_max_total_cached_tokens,
            )  # fmt: skip
            if stop is not None:
                return stop, loaded, extend, extend_paged, cut
    return None, loaded, extend, extend_paged, cut


def memory_tokens(uncached: int, max_new_left: int, page: int) -> int:
    """What ``add_one_req``'s memory check asks for: ``(L - D) + min(max_new left, 4096) +
    page`` (``uncached`` = ``L - D``, ``max_new_left`` clipped); the request passes when it is
    less than ``rem_total``."""
    return uncached + max_new_left + page


def _chunk_tokens(tokens_left: int, rem_chunk: int, rem_total: float) -> int:
    """``add_chunked_req``: the tokens the chunked request computes this pass (0: none)."""
    limit = min(rem_chunk, int(rem_total))
    if limit <= 0:
        limit = rem_chunk
    if limit <= 0:
        return 0
    return limit if tokens_left > limit else tokens_left


def budget_state(
    rem_total: float, cur_rem: float, rem_input: int, rem_chunk: int | None
) -> str | None:
    """SGLang's ``budget_state()``: the budget that is spent (None: the pass goes on)."""
    if rem_total <= 0:
        return "rem_total_tokens"
    if cur_rem <= 0:
        return "cur_rem_tokens"
    if rem_input <= 0:
        return "rem_input_tokens"
    if rem_chunk is not None and rem_chunk <= 0:
        return "rem_chunk_tokens"
    return None
