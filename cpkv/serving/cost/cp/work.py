"""The per-rank terms of one CP prefill iteration, each its own function, and their constants.

One iteration with ``P`` > 0 prefill tokens after ``C`` cached tokens (the prefixes of its
chunks: L1 hits, L2 hits loaded back, earlier chunks; ``C = prefill_context − P``), ``pairs``
causal attention pairs and ``loaded`` tokens loaded back from L2, on ``n`` ranks of ``l``
layers each (all in microseconds, per rank; the ranks run in parallel, so the iteration takes
one rank's time):

* **split** (:func:`split`): each rank computes ``⌈P/n⌉`` of the extend tokens (the linear
  layers, elementwise kernels, all-reduces and the CPU work of the roofline model run on
  them) and ``⌈pairs/n⌉`` of the attention pairs. SGLang's zigzag split
  (:func:`~.layout.zigzag_pairs`) gives every rank the same pairs when ``2n`` divides a chunk
  (within a few tokens' worth otherwise); the cost interface sees a batch's sums, not its
  chunks, so the balanced share is what is priced;
* **attention against the whole prefix**: the roofline model's attention of ``⌈P/n⌉`` query
  tokens whose context is the whole batch's ``C + P`` (the reads; with MLA the up-projection
  of every key this rank did not compute, ``C + P − ⌈P/n⌉``; with sparse attention the
  indexer on the rank's pairs);
* **exchange** (:func:`exchange_us`, part ``communication``): ``all_gather``: per layer an
  all-gather of the extend tokens' KV, ``P × b`` bytes over ``n`` ranks
  (:func:`~cpkv.serving.cost.allreduce.allgather_us`, the GPU's NVLink and its all-reduce
  regimes fitted at ``n`` workers); ``ring``: the same transfer, less the layer's attention
  it hides behind, never below 0;
* **materialise** (:func:`materialise_us`, part ``communication``): the cached prefix's KV
  pages lie round-robin on the ranks' owner lanes (:mod:`.layout`), so each rank gathers the
  ``(n−1)/n`` it does not own before attending to the whole prefix: per layer an all-gather
  of ``C × b`` bytes. 0 on one rank (the pages are local). That the prefix moves as an
  all-gather of the pages is **an assumption** (seed 000 names "prefix materialise" as
  cached-token work without saying how; a kernel reading remote pages in place would move
  the same bytes);
* **index / top-k** (:func:`topk_us`, part ``attention``; sparse attention only): the
  indexer's scores of a prefill batch are one fp32 matrix of the batch's queries by the
  batch's keys (DeepGEMM's ``fp8_mqa_logits``, which SGLang's and vLLM's DSA indexers call
  for prefill: output ``[seq_len, seq_len_kv]``, the requests' keys concatenated and each
  query's range given by ``ks``/``ke``): a rank writes its ``⌈P/n⌉`` rows of ``C + P``
  scores (:data:`SCORE_BYTES` each), and the top-k reads each query's own scores
  (``⌈pairs/n⌉`` of them) ``topk_passes`` times, at the elementwise kernels' share of HBM
  bandwidth, per layer (the indexer's FLOPs are the roofline model's). The matrix makes a
  batch of ``k`` requests cost ``k²``: every query's row spans every request's cached tokens;
* **load-back** (:func:`load_back_pages`, :func:`load_back_us`, part ``load``): each rank
  loads the L2 hits' pages it owns, the fullest lane ``⌈⌈loaded/page⌉/n⌉`` pages: their bytes
  (the roofline model's load of that lane's tokens) plus ``load_back_page_us`` a page;
* **descriptors** (:func:`descriptors_us`, part ``overhead``): the engine's CPU builds the
  batch's page descriptors, ``descriptor_fixed_us + descriptor_page_us × ⌈(C + P)/page⌉``,
  not overlapped with the GPU (an upper bound, as the model's other sums).

``b`` is one token's KV bytes of one layer on one GPU of a rank (the latent of MLA, this
GPU's KV heads otherwise) plus, with sparse attention, the indexer's key
(``index_token_bytes``).

Constants (defaults of ``admit.cost.cp``) and where they come from:

* :data:`SCORE_BYTES` 4: the indexer's scores are fp32 logits, a matrix of the batch's
  queries by its keys (DeepGEMM's ``fp8_mqa_logits`` interface). The bytes are a fact of the
  kernel; that a rank pays for writing its whole rows (the interface's ``clean_logits`` fills
  the scores outside each query's range, and the top-k is given rows of the batch's length)
  is **an assumption**, an upper bound where a kernel skips the rest;
* ``topk_passes`` 2: **an assumption**: a radix-select top-k reads its input about twice (a
  histogram pass, a select pass); not measured here;
* ``descriptor_page_us`` 1.25: **an assumption anchored on a measurement**: seed 003's
  reference ``alloc_pages`` of 64 round-robin pages takes 80.36 µs at p50 on this lab's CPU
  (docs/allocators.md), 1.26 µs a page; building a page's descriptor is taken to cost as much
  as allocating it (the same per-page Python and tensor bookkeeping);
* ``descriptor_fixed_us`` 50: **an assumption**: a few tensor builds and one host-to-device
  copy of the descriptors per batch;
* ``load_back_page_us`` 1.0: **an assumption**: about one DMA submission a page (the host
  tier's page-first layout copies a page of all layers at once); not measured here.

The materialisation and the descriptors are linear in ``C``; the index scores grow as the
batch's queries times its cached tokens: a batch of many high-hit requests pays for every
cached token it holds, once per query of every request, which is why
``admit.cp.max_total_cached_tokens`` exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpkv.serving.cost.allreduce import AllReduceRegimes, allgather_us
from cpkv.serving.cost.cp.layout import fullest_lane_pages

SCORE_BYTES = 4
"""Bytes of one index score: the DSA indexers' fp32 logits."""


@dataclass(frozen=True)
class CpWork:
    """The constants of one CP deployment's terms (module docstring)."""

    size: int
    layers: int
    token_bytes: float  # b: one token's KV (+ indexer key) bytes, one layer, one GPU
    link_gb_per_s: float
    regimes: AllReduceRegimes
    score_write_us: float  # one score of the rank's rows written, one layer; 0 dense
    score_pair_us: float  # one pair's score read by the top-k (all passes), one layer; 0 dense
    exchange: str = "all_gather"
    page_size: int = 64
    descriptor_page_us: float = 1.25
    descriptor_fixed_us: float = 50.0
    load_back_page_us: float = 1.0


def split(prefill_tokens: int, pairs: int, size: int) -> tuple[int, int]:
    """A rank's share ``(⌈P/n⌉, ⌈pairs/n⌉)`` of the extend tokens and attention pairs."""
    return -(-prefill_tokens // size), -(-pairs // size)


def exchange_us(work: CpWork, extend_tokens: int, attention_layer_us: float) -> float:
    """The extend KV's exchange over all layers: an all-gather of ``P × b`` bytes a layer, or
    (``ring``) what of it the layer's attention ``attention_layer_us`` does not hide."""
    gather = allgather_us(
        extend_tokens * work.token_bytes, work.size, work.link_gb_per_s, work.regimes
    )
    if work.exchange == "ring":
        gather = gather - attention_layer_us if gather > attention_layer_us else 0.0
    return work.layers * gather


def materialise_us(work: CpWork, cached_tokens: int) -> float:
    """Gathering the cached prefix's pages the rank does not own, all layers: an all-gather
    of ``C × b`` bytes a layer (0 on one rank)."""
    return work.layers * allgather_us(
        cached_tokens * work.token_bytes, work.size, work.link_gb_per_s, work.regimes
    )


def topk_us(work: CpWork, rank_tokens: int, batch_tokens: int, rank_pairs: int) -> float:
    """The index scores of the rank's ``rank_tokens`` queries against the batch's
    ``batch_tokens`` keys written, and its pairs' scores read by the top-k, all layers."""
    write = work.score_write_us * rank_tokens * batch_tokens
    return work.layers * (write + work.score_pair_us * rank_pairs)


def load_back_pages(work: CpWork, loaded_tokens: int) -> int:
    """The pages of ``loaded_tokens`` the fullest owner lane holds (:mod:`.layout`)."""
    return fullest_lane_pages(loaded_tokens, work.page_size, work.size)


def load_back_us(work: CpWork, loaded_tokens: int) -> float:
    """The per-page cost of a rank's load-back (its bytes are the roofline model's load)."""
    return work.load_back_page_us * load_back_pages(work, loaded_tokens)


def descriptors_us(work: CpWork, batch_tokens: int) -> float:
    """The CPU's page descriptors of a batch of ``batch_tokens`` (``C + P``) tokens."""
    return work.descriptor_fixed_us + work.descriptor_page_us * -(-batch_tokens // work.page_size)
