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
from typing import Any

from cpkv.workload.request import CLIP_MAX_NEW_TOKENS

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

    @property
    def cp_on(self) -> bool:
        """Whether a CP shared-KV limit applies (cpkv's own limits, not upstream SGLang)."""
        return (
            self.cp_max_batch_requests is not None
            or self.cp_max_total_extend_tokens is not None
            or self.cp_max_total_cached_tokens is not None
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    """A waiting request as the pass sees it: fill length ``L``, device prefix ``d``, host
    hit ``h`` (both page aligned), ``max_new`` left and ``max_new`` as first asked."""

    fill: int
    d: int
    h: int
    max_new_left: int
    max_new: int


@dataclass
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
    avail: int,
    mixed: int,
    headroom: float,
    running: int,
    b: AdderBudgets,
    chunk: tuple[int, int, int] | None,
    queue: Iterator[Candidate],
) -> PassResult:
    """One scheduling pass; ``chunk`` is ``(tokens left, max_new, tokens before the chunk)``
    of the request being chunked, ``headroom`` the running requests'
    ``sum(min(max_new left, 4096)) * ratio``; ``max_new`` values arrive clipped to 4096."""
    page = b.page
    base = avail
    total_off = mixed + headroom
    cur_off = mixed
    rem_input = b.max_prefill_tokens - mixed
    rem_chunk = None if b.chunk_tokens is None else b.chunk_tokens - mixed
    out = PassResult(admitted=[])
    n_batch = 0
    cp_on = b.cp_on
    cp_ext = cp_cached = 0
    if chunk is not None and rem_chunk is not None:  # add_chunked_req
        left, mx, prefix = chunk
        lim = min(rem_chunk, int(base - total_off))
        if lim <= 0:
            lim = rem_chunk
        if lim > 0:
            trunc = left > lim
            e = lim if trunc else left
            ep = -(-e // page) * page
            total_off += ep + page + (0 if trunc else mx)
            cur_off += ep + page
            rem_input -= ep
            rem_chunk -= ep
            out.chunk_tokens, out.chunk_done = e, not trunc
            cp_ext, cp_cached = ep, -(-prefix // page) * page
            n_batch = 1
    cap = NO_CAP if b.max_running_requests is None else b.max_running_requests - running
    pmr = NO_CAP if b.prefill_max_requests is None else b.prefill_max_requests
    thr = max(1, b.load_back_threshold)
    first = True
    while out.stop is None:
        c = next(queue, None)
        if c is None:
            break
        if first and base - total_off > 0 and base - cur_off > 0:  # budget_state() on top
            if rem_input <= 0:
                out.stop = "rem_input_tokens"
            elif rem_chunk is not None and rem_chunk <= 0:
                out.stop = "rem_chunk_tokens"
            if out.stop is not None:
                break
        first = False
        if n_batch >= cap:
            out.stop = "max_running_requests"
            break
        if n_batch >= pmr:
            out.stop = "prefill_max_requests"
            break
        if not c.fill - c.d + c.max_new_left + page < base - total_off:
            out.stop = "rem_total_tokens"
            break
        # select with the host hit; a hit below the threshold is declined: select again without
        for loaded in (c.h, 0) if 0 < c.h < thr else (c.h,):
            p = c.d + loaded
            e = c.fill - p
            ep = -(-e // page) * page
            cut = False
            if rem_chunk is None:
                if n_batch and ep >= rem_input:
                    out.stop = "rem_input_tokens"
                    break
            elif ep > rem_chunk:
                ep = e = rem_chunk // page * page
                if e <= 0:
                    out.stop = "rem_chunk_tokens"
                    break
                cut = True
            if cp_on and n_batch:
                out.stop = _cp_stop(b, n_batch, cp_ext + ep, cp_cached + p)
                if out.stop is not None:
                    break
        if out.stop is not None:
            break
        base -= loaded
        total_off += ep + page + (0 if cut else c.max_new)
        cur_off += ep + page
        rem_input -= ep
        if rem_chunk is not None:
            rem_chunk -= ep
        cp_ext += ep
        cp_cached += p
        n_batch += 1
        out.admitted.append((e, loaded, cut))
        if base - total_off <= 0:
            out.stop = "rem_total_tokens"
        elif base - cur_off <= 0:
            out.stop = "cur_rem_tokens"
        elif rem_input <= 0:
            out.stop = "rem_input_tokens"
        elif rem_chunk is not None and rem_chunk <= 0:
            out.stop = "rem_chunk_tokens"
    return out


def _cp_stop(b: AdderBudgets, n_batch: int, ext: int, cached: int) -> str | None:
    """The CP limit a batch of ``n_batch + 1`` requests with these page-aligned sums breaks."""
    if b.cp_max_batch_requests is not None and n_batch + 1 > b.cp_max_batch_requests:
        return "cp_max_batch_requests"
    if b.cp_max_total_extend_tokens is not None and ext > b.cp_max_total_extend_tokens:
        return "cp_max_total_extend_tokens"
    if b.cp_max_total_cached_tokens is not None and cached > b.cp_max_total_cached_tokens:
        return "cp_max_total_cached_tokens"
    return None


def adder_step(sim: Any, n_decode: int) -> None:
    """Admission and prefill of one iteration for policy ``prefill_adder`` (on a
    :class:`~cpkv.serving.loop.Sim`): one pass, then its decisions applied."""
    pool, chunked = sim.pool, sim.chunked
    chunk = None
    if chunked is not None:
        mx = min(chunked.max_new, CLIP_MAX_NEW_TOKENS)
        chunk = (chunked.P - chunked.done, mx, chunked.done)
    headroom = pool.headroom_tokens() * sim.ratio.current
    res = adder_pass(
        pool.free * sim.B, n_decode, headroom, pool.n_run, sim.s.adder, chunk, _candidates(sim)
    )
    if res.chunk_tokens:
        e = res.chunk_tokens
        sim.prefill_tokens += e
        sim.prefill_context += chunked.done + e
        chunked.done += e
        chunked.prefilled += e
        if res.chunk_done:
            sim.completed.append(chunked)
            sim.chunked = None
    waiting = sim.waiting
    for k, (e, _loaded, cut) in enumerate(res.admitted):
        r = waiting[k]
        d, h = sim.hit(r)
        sim.admit(r, d, h, None)
        sim.prefill_tokens += e
        sim.prefill_context += r.done + e
        r.done += e
        r.prefilled += e
        if cut:
            sim.chunked = r
        else:
            sim.completed.append(r)
    del waiting[: len(res.admitted)]
    if res.stop is not None:
        sim.stop_counts[res.stop] = sim.stop_counts.get(res.stop, 0) + 1


def _candidates(sim: Any) -> Iterator[Candidate]:
    for r in sim.waiting:
        d, h = sim.hit(r)
        left = min(r.max_new - r.gen, CLIP_MAX_NEW_TOKENS)
        yield Candidate(r.P, d, h, left, min(r.max_new, CLIP_MAX_NEW_TOKENS))
