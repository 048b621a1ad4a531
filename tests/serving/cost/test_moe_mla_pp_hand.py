"""Experts, latent and sparse attention, expert and pipeline parallelism on the tiny model and
GPU of ``test_roofline_hand``: every number worked out in the comments from the formulas of
``docs/cost-model.md`` (1 TFLOP/s: GEMMs at 5e5 FLOP/us, attention at 2.5e5; HBM 5e4 B/us for
GEMMs, attention and elementwise kernels; GEMM tile 8, latency 1 us; ``max(C, M)``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cpkv.serving.cost.layers.attention import attention_work
from cpkv.serving.cost.layers.dense import attention_gemms
from cpkv.serving.cost.layers.experts import experts_touched
from cpkv.serving.cost.roofline import RooflineCost
from tests.serving.cost.test_roofline_hand import CHIP, CHIP_CAL, TINY

# one dense layer, then one of 4 experts of width 32, 2 a token
TINY_MOE = replace(TINY, experts=4, experts_per_token=2, expert_mlp=32, dense_layers=1)
# latent attention: KV latent 32 + rotary key 8, query latent 48, value heads 16
TINY_MLA = replace(TINY, kv_heads=4, kv_lora_rank=32, q_lora_rank=48, rope_head_dim=8,
                   v_head_dim=16)  # fmt: skip


def test_expected_experts_touched() -> None:
    # 4 experts, 2 a token: a token misses an expert with probability 1/2, so 3 tokens touch
    # 4 * (1 - 1/8) = 3.5 of them; one token exactly its 2
    assert experts_touched(4, 2, 3) == pytest.approx(3.5, rel=1e-12)
    assert experts_touched(4, 2, 1) == pytest.approx(2.0, rel=1e-12)
    assert experts_touched(256, 8, 0) == 0.0
    assert experts_touched(256, 8, 100_000) == pytest.approx(256.0, rel=1e-12)


def test_a_decode_iteration_of_a_mixture_of_experts_by_hand() -> None:
    parts = RooflineCost(TINY_MOE, CHIP).breakdown(0, 3, 60, 0, 0, 0)
    # the dense layer: test_one_decode_iteration_by_hand's four GEMMs, 5.5744 us
    dense = 1.35072 + 1.1792 + 1.69376 + 1.35072
    # the layer of experts: QKV and output as above (2.52992), the router (64 x 4):
    # C = 2*8*64*4/5e5 = 0.008192 < M = (64*4*2 + 3*68*2)/5e4 = 0.0184 -> 1.0184
    side = 1.35072 + 1.1792 + 1.0184
    # routed: 3 tokens x 2 = 6 assignments over 3.5 experts (1.71 rows each, padded to 8:
    # 28 rows); gate+up (64 x 64): C = 2*64*64*28/5e5 = 0.458752 < M = (3.5*8192 + 6*256)/5e4
    # = 0.60416; down (32 x 64): C = 0.229376 < M = (3.5*4096 + 6*192)/5e4 = 0.30976
    routed = (1 + 0.60416) + (1 + 0.30976)
    head = 1 + 0.69376  # as test_one_decode_iteration_by_hand
    gemm = dense + side + routed + head  # 13.7304
    # elementwise: the dense layer 2.5 + 3*2048/5e4 = 2.62288; the experts' layer's
    # activation is the token's 2 experts' width, 64: (256 + 192 + 3*64 + 192) elements x 2 B
    # = 1664 B -> 2.5 + 3*1664/5e4 = 2.59984
    elementwise = 2.62288 + 2.59984
    attention = 2 * 0.1536  # as the dense model's
    assert gemm == pytest.approx(13.7304, rel=1e-12)
    assert parts[1:4] == pytest.approx((gemm, elementwise, attention), rel=1e-12)
    assert parts[0] == pytest.approx(gemm + elementwise + attention + 10.0, rel=1e-12)
    # FLOPs: active weights 2 x 12288 (attention) + 24576 (dense MLP) + 256 (router) + 2 x
    # 6144 (two experts) = 61696, x 2 x 3 tokens; the LM head 2 x 16384 x 3; attention
    # 4*16*4 x 2 layers x 60 = 30720
    assert parts[7] == 2 * 61696 * 3 + 2 * 16384 * 3 + 30720


def test_expert_parallelism_trades_the_experts_all_reduce_for_two_all_to_alls() -> None:
    cal = replace(CHIP_CAL, alltoall_bw_eff=0.5)  # 5e3 B/us of the 10 GB/s link
    parts = RooflineCost(TINY_MOE, CHIP, tp=2, calibration=cal, ep=2).breakdown(0, 4, 40, 0, 0, 0)
    # one all-reduce of 4 tokens x 64 x 2 B = 512 B over 2 GPUs (ring factor 1): 2 + 512/5e3
    reduce = 2 + 0.1024
    # an all-to-all: each GPU sends its 2 tokens x 2 experts x 64 x 2 B, half of it away:
    # 256 B -> 2 (the all-reduce's latency) + 256/5e3
    a2a = 2 + 0.0512
    assert parts[4] == pytest.approx(2 * reduce + (reduce + 2 * a2a), rel=1e-12)
    without = RooflineCost(TINY_MOE, CHIP, tp=2, calibration=cal).breakdown(0, 4, 40, 0, 0, 0)
    assert without[4] == pytest.approx(4 * reduce, rel=1e-12)


def test_a_pipeline_splits_the_batch_into_micro_batches_by_hand() -> None:
    # 2 stages of 1 layer; 3 decoding requests -> 2 micro-batches of 2 tokens (and 2 LM-head
    # rows); the layers evenly split: factor 1
    parts = RooflineCost(TINY, CHIP, pp=2).breakdown(0, 3, 60, 0, 0, 0)
    # a layer on 2 tokens (padded to 8): QKV M = (16384 + 2*192*2)/5e4 = 0.34304, output
    # 0.17408, gate+up 0.68096, down 0.34304 (all memory-bound), + 4 x 1 us
    layer = 4 + 0.34304 + 0.17408 + 0.68096 + 0.34304
    head = 1 + 0.68096
    assert parts[1] == pytest.approx(2 * layer + head, rel=1e-12)  # 12.7632
    assert parts[2] == pytest.approx(2 * (2.5 + 2 * 2048 / 5e4), rel=1e-12)
    # one transfer of 2 tokens x 64 x 2 B = 256 B, as a two-GPU all-reduce: 2 + 256/5e3
    assert parts[4] == pytest.approx(2.0512, rel=1e-12)
    # attention: half the iteration's (a micro-batch's), 0.3072 / 2
    assert parts[3] == pytest.approx(0.1536, rel=1e-12)
    assert RooflineCost(TINY, CHIP, pp=2).peak_flops_per_us == 2e6


def test_one_sequence_crosses_the_pipeline_alone() -> None:
    # batch 1: one micro-batch, the whole model on one token, plus the transfer: a pipeline
    # is no faster than one GPU for one sequence, only slower by its transfers
    one = RooflineCost(TINY, CHIP).breakdown(0, 1, 20, 0, 0, 0)
    staged = RooflineCost(TINY, CHIP, pp=2).breakdown(0, 1, 20, 0, 0, 0)
    transfer = 2 + 1 * 64 * 2 / 5e3
    assert staged[0] == pytest.approx(one[0] + transfer, rel=1e-12)


def test_an_uneven_pipeline_is_paced_by_its_largest_stage() -> None:
    three = replace(TINY, layers=3)  # 2 stages of 2 and 1 layers
    full = RooflineCost(three, CHIP, pp=2).breakdown(0, 4, 80, 0, 0, 0)
    # 2 micro-batches of 2 tokens: factor 2 * 2 / 3; the layers' parts of 2 tokens scaled
    layer = 4 + 0.34304 + 0.17408 + 0.68096 + 0.34304
    assert full[1] == pytest.approx(4 / 3 * 3 * layer + 1 + 0.68096, rel=1e-12)


def test_latent_attention_work_by_hand() -> None:
    work = attention_work(TINY_MLA, 1)
    # 4 heads: prefill pair 2*(16+8) + 2*16 = 80 FLOPs a head; decode (absorbed) 2*(32+8) +
    # 2*32 = 144 a head; a prefix token's up-projection 2*32*4*(16+16) = 8192; the latent
    # read (32+8)*2 B = 80 B a token (not split over GPUs)
    assert (work.prefill_pair_flops, work.decode_pair_flops) == (320.0, 576.0)
    assert work.prefix_token_flops == 8192.0
    assert work.context_token_bytes == 80
    assert attention_work(TINY_MLA, 2).context_token_bytes == 80
    assert TINY_MLA.kv_bytes_per_token() == 2 * 80
    # projections: query down (64 x 48), KV down (64 x 40), query up (48 x 4*24), KV up
    # (32 x 4*32), output (64 x 64)
    assert attention_gemms(TINY_MLA, 1) == ((64, 48), (64, 40), (48, 96), (32, 128), (64, 64))
    assert attention_gemms(TINY_MLA, 2) == ((64, 48), (64, 40), (48, 48), (32, 64), (32, 64))


def test_latent_attention_in_an_iteration_by_hand() -> None:
    m = RooflineCost(TINY_MLA, CHIP)
    # decode, 3 requests, 60 context tokens: per layer max(576*60/2.5e5, 80*60/5e4)
    # = max(0.13824, 0.096)
    assert m.breakdown(0, 3, 60, 0, 0, 0)[3] == pytest.approx(2 * 0.13824, rel=1e-12)
    # prefill of 20 tokens after a 12-token prefix: 450 pairs x 320 / 2.5e5 = 0.576, the
    # prefix's up-projection 12 x 8192 / 5e5 (a GEMM's rate) = 0.196608; reads 32 x 80 / 5e4
    assert m.breakdown(20, 0, 0, 32, 450, 0)[3] == pytest.approx(2 * 0.772608, rel=1e-12)


def test_sparse_attention_caps_what_a_query_reads_by_hand() -> None:
    sparse = replace(TINY_MLA, index_topk=16, index_heads=2, index_head_dim=8)
    # the indexer's key: 8 B of FP8 and a 4 B scale a token and layer
    assert sparse.kv_bytes_per_token() == 2 * (80 + 12)
    m = RooflineCost(sparse, CHIP)
    # decode, 3 requests, 60 context tokens: the main attention over min(60, 3*16) = 48
    # tokens at max(576/2.5e5, 80/5e4) = 0.002304 us each; the indexer over all 60 at
    # max(2*2*8/2.5e5, 12/5e4) = 0.00024
    per_layer = 48 * 0.002304 + 60 * 0.00024
    assert m.breakdown(0, 3, 60, 0, 0, 0)[3] == pytest.approx(2 * per_layer, rel=1e-12)
    # short contexts are not capped: 3 requests reading 30 tokens
    dense_like = 30 * 0.002304 + 30 * 0.00024
    assert m.breakdown(0, 3, 30, 0, 0, 0)[3] == pytest.approx(2 * dense_like, rel=1e-12)
    # its stretches go iteration by iteration, and agree with batch_us
    d = m.stretch(0, 3, 30, 0, 0, 0, 0)
    assert [d.duration(j) for j in range(12)] == [
        m.batch_us(0, 3, 30 + 3 * j, 0, 0, 0) for j in range(12)
    ]
