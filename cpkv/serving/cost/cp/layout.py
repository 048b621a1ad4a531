"""Where a CP prefill's tokens and KV pages fall on the ``cp_size`` ranks.

**The extend tokens: the zigzag split.** SGLang's CP prefill (the in-seq-split mode of its
DeepSeek-V3.2 prefill CP, ``prepare_input_dp_with_cp_dsa`` in
``python/sglang/srt/layers/attention/nsa/utils.py``) cuts a request's ``e`` extend tokens into
``2·cp`` segments of ``⌊e/2cp⌋`` tokens, the first ``e mod 2cp`` one token longer, and gives
rank ``r`` segments ``r`` and ``2cp − 1 − r``: a causal chunk's early queries (few keys) and
late queries (many keys) on the same rank, so that every rank computes the same attention
pairs (exactly ``1/cp`` of them when ``2cp`` divides ``e``). vLLM's prefill CP splits the
sequence the same way for the same reason (``docs/serving/context_parallel_deployment.md``:
each GPU computes its chunk's queries against the gathered keys and values).
:func:`zigzag_split` returns each rank's share.

**The KV pages: round-robin owners.** The CP shared paged L1 pool (seed 003's
``CPSharedPagedTokenToKVPoolAllocator``) numbers ``cp_size × physical_pages`` logical pages
and stores logical page ``p`` (from 1) on rank ``(p − 1) mod cp_size``: each rank owns
``physical_pages`` of them, its owner lane. A request's pages dealt round-robin (seed 003's
``round_robin`` owner pattern) put ``⌈pages/cp⌉`` on the fullest lane
(:func:`round_robin_pages`); the pool's L1 capacity is ``cp_size`` lanes of each rank's pages
(:func:`l1_capacity_tokens`), and a request fits while its fullest lane does. That lane is
lane 0, which holds pages ``0, cp, 2·cp, …`` of every request: ``⌈pages/cp⌉`` of a request
of ``pages`` pages, one more each time the request crosses a multiple of ``cp`` pages. So the
pool admits and grows requests exactly as a pool of ``physical_pages`` stripes of ``cp``
pages each (:func:`lane_pool`).
"""

from __future__ import annotations


def zigzag_split(extend_tokens: int, cp_size: int) -> list[int]:
    """Each rank's extend tokens of one request under the zigzag split (module docstring)."""
    segments = 2 * cp_size
    base, rem = divmod(extend_tokens, segments)
    sizes = [base + (1 if i < rem else 0) for i in range(segments)]
    return [sizes[r] + sizes[segments - 1 - r] for r in range(cp_size)]


def zigzag_pairs(prefix_tokens: int, extend_tokens: int, cp_size: int) -> list[int]:
    """Each rank's causal attention pairs for one request of ``extend_tokens`` after
    ``prefix_tokens`` cached tokens under the zigzag split: a segment of ``s`` tokens
    starting ``k`` tokens into the chunk computes ``s·(prefix + k) + s(s+1)/2`` pairs."""
    segments = 2 * cp_size
    base, rem = divmod(extend_tokens, segments)
    sizes = [base + (1 if i < rem else 0) for i in range(segments)]
    starts = [sum(sizes[:i]) for i in range(segments)]

    def pairs(i: int) -> int:
        s = sizes[i]
        return s * (prefix_tokens + starts[i]) + s * (s + 1) // 2

    return [pairs(r) + pairs(segments - 1 - r) for r in range(cp_size)]


def round_robin_pages(pages: int, cp_size: int) -> list[int]:
    """Each rank's pages of a request of ``pages`` pages dealt round-robin (page ``i`` from
    0 on rank ``i mod cp_size``)."""
    base, rem = divmod(pages, cp_size)
    return [base + (1 if r < rem else 0) for r in range(cp_size)]


def fullest_lane_pages(tokens: int, page_size: int, cp_size: int) -> int:
    """The pages the fullest owner lane holds of ``tokens`` tokens: ``⌈⌈tokens/page⌉/cp⌉``."""
    pages = -(-tokens // page_size)
    return -(-pages // cp_size)


def l1_capacity_tokens(rank_pages: int, page_size: int, cp_size: int) -> int:
    """The L1 tokens of a pool of ``cp_size`` owner lanes of ``rank_pages`` pages each."""
    return rank_pages * page_size * cp_size


def lane_pool(rank_pages: int, page_size: int, cp_size: int) -> tuple[int, int]:
    """The serving pool that a shared paged L1 pool of ``cp_size`` owner lanes of
    ``rank_pages`` pages behaves as under round-robin owners: ``(block tokens, blocks)``,
    stripes of ``cp_size`` pages, as many as lane 0 holds."""
    return page_size * cp_size, rank_pages
