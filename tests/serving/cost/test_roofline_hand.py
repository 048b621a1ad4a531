"""The roofline model on a tiny model and GPU: one prefill and one decode iteration computed by
hand (every number below is worked out in the comments from the model's formulas, not taken
from the code), then a tensor-parallel iteration's all-reduce and the quadratic attention."""

from __future__ import annotations

import pytest

from cpkv.serving.cost.calibration import Calibration
from cpkv.serving.cost.gpus import Gpu
from cpkv.serving.cost.roofline import RooflineCost
from cpkv.serving.cost.shapes import ModelShape

# 2 layers, hidden 64, 4 heads of 16, 2 KV heads, SwiGLU MLP 128, vocab 256, BF16
TINY = ModelShape(2, 64, 4, 2, 16, 128, True, 256)
# 1 TFLOP/s = 1e6 FLOP/us; 100 GB/s HBM = 1e5 B/us; 1 GB/s PCIe = 1e3 B/us; NVLink 10 GB/s
CHIP_CAL = Calibration(
    gemm_flops_eff=0.5,  # 5e5 FLOP/us
    gemm_bw_eff=0.5,  # 5e4 B/us
    gemm_latency_us=1.0,
    gemm_tile_tokens=8,
    gemm_corner=0.0,  # max(C, M)
    elementwise_bw_eff=0.5,  # 5e4 B/us
    elementwise_latency_us=0.5,
    allreduce_bw_eff=0.5,  # 5e3 B/us of NVLink
    allreduce_latency_us=2.0,
    allreduce_small_bw_eff=0.5,
    allreduce_switch_bytes=0,  # one regime: 2 us + bytes / 5e3 B/us
    attention_flops_eff=0.25,  # 2.5e5 FLOP/us
    attention_bw_eff=0.5,  # 5e4 B/us
    load_bw_eff=0.5,  # 500 B/us
    overhead_us=10.0,
)
CHIP = Gpu(1.0, 100.0, 1.0, 10.0, CHIP_CAL)


def test_one_prefill_iteration_by_hand() -> None:
    # one chunk of 20 tokens after a 12-token prefix that was loaded back from L2:
    # pairs = 20*12 + 20*21/2 = 240 + 210 = 450; prefill context = 12 + 20 = 32
    m = RooflineCost(TINY, CHIP)
    parts = m.breakdown(20, 0, 0, 32, 450, 12)
    # T = 20 tokens, padded to the 8-token tile: 24. Per GEMM, C = 2*24*K*N / 5e5,
    # M = (K*N*2 + 20*(K+N)*2) / 5e4, time = 1 + max(C, M):
    qkv = 1 + max(2 * 24 * 64 * 128 / 5e5, (64 * 128 * 2 + 20 * 192 * 2) / 5e4)
    assert qkv == pytest.approx(1 + 0.786432)  # K=64, N=(4+2*2)*16=128: C 0.786432 > M 0.48128
    out = 1 + 0.393216  # K=64, N=64: C = 196608/5e5 = 0.393216 > M = 13312/5e4 = 0.26624
    up = 1 + 1.572864  # K=64, N=2*128: C = 786432/5e5 = 1.572864 > M = 45568/5e4 = 0.91136
    down = 1 + 0.786432  # K=128, N=64: as QKV
    # LM head on 1 token (the prompt's last), padded to 8: C = 2*8*64*256/5e5 = 0.524288,
    # M = (64*256*2 + 1*320*2)/5e4 = 33408/5e4 = 0.66816 (memory-bound)
    head = 1 + 0.66816
    gemm = 2 * (qkv + out + up + down) + head  # = 2 * 7.538944 + 1.66816 = 16.746048
    # elementwise bytes per token: 2 norms (2*2*64) + rope (2*(4+2)*16) + act (3*128) + add
    # (3*64) = 256 + 192 + 384 + 192 = 1024 elements = 2048 B; per layer 5*0.5 + 20*2048/5e4
    elementwise = 2 * (2.5 + 0.8192)  # = 6.6384
    # attention per layer: max(4*16*4*450 / 2.5e5, 32 tokens * 128 B (2*2 KV heads*16*2) / 5e4)
    # = max(115200/2.5e5 = 0.4608, 4096/5e4 = 0.08192)
    attention = 2 * 0.4608  # = 0.9216
    # load-back: 12 tokens * 2 layers * 128 B = 3072 B at 500 B/us
    load = 6.144
    overhead = 10.0
    total = gemm + elementwise + attention + load + overhead  # 40.450048
    assert total == pytest.approx(40.450048, rel=1e-12)
    assert parts[1:7] == pytest.approx(
        (gemm, elementwise, attention, 0.0, load, overhead), rel=1e-12
    )
    assert parts[0] == pytest.approx(total, rel=1e-12)
    assert m.batch_us(20, 0, 0, 32, 450, 12) == parts[0]
    # model FLOPs: 2 * 2 layers * 36864 weights * 20 tokens + LM head 2*64*256*1 + attention
    # 4*2 layers*16*4 heads*450 pairs = 2,949,120 + 32,768 + 230,400
    assert parts[7] == 3_212_288


def test_one_decode_iteration_by_hand() -> None:
    # three requests decode one token each; their contexts 10 + 20 + 30 = 60 KV tokens
    m = RooflineCost(TINY, CHIP)
    parts = m.breakdown(0, 3, 60, 0, 0, 0)
    # T = 3, padded to 8: every GEMM is memory-bound now:
    qkv = 1 + (64 * 128 * 2 + 3 * 192 * 2) / 5e4  # 17536/5e4 = 0.35072 > C 0.262144
    out = 1 + (64 * 64 * 2 + 3 * 128 * 2) / 5e4  # 8960/5e4 = 0.1792 > C 0.131072
    up = 1 + (64 * 256 * 2 + 3 * 320 * 2) / 5e4  # 34688/5e4 = 0.69376 > C 0.524288
    down = qkv
    head = 1 + 0.69376  # three tokens through the LM head: as up
    gemm = 2 * (qkv + out + up + down) + head  # 2 * 5.5744 + 1.69376 = 12.84256
    elementwise = 2 * (2.5 + 3 * 2048 / 5e4)  # 2 * 2.62288 = 5.24576
    # decode attention per layer: max(4*16*4*60 / 2.5e5 = 0.06144, 60*128 / 5e4 = 0.1536)
    attention = 2 * 0.1536  # memory-bound: 0.3072
    total = gemm + elementwise + attention + 10.0
    assert total == pytest.approx(28.39552, rel=1e-12)
    assert parts[:7] == pytest.approx(
        (total, gemm, elementwise, attention, 0.0, 0.0, 10.0), rel=1e-12
    )


def test_tensor_parallel_all_reduce_by_hand() -> None:
    # TP 2: two all-reduces per layer of T * 64 hidden * 2 bytes, ring factor 2*(2-1)/2 = 1
    m = RooflineCost(TINY, CHIP, tp=2)
    parts = m.breakdown(0, 5, 50, 0, 0, 0)
    # per all-reduce: 2 us + 5 * 64 * 2 B / 5e3 B/us = 2 + 0.128; 2 per layer, 2 layers
    assert parts[4] == pytest.approx(4 * 2.128, rel=1e-12)
    # the heads split: 2 heads and 1 KV head per GPU; decode attention per layer:
    # max(4*16*2*50 / 2.5e5 = 0.0256, 50 tokens * 2*1*16*2 B / 5e4 = 0.064) = 0.064
    assert parts[3] == pytest.approx(2 * 0.064, rel=1e-12)
    # MFU counts all GPUs: peak 2 GPUs x 1e6 FLOP/us
    assert m.peak_flops_per_us == 2e6


def test_prefill_attention_is_quadratic_in_the_prefix() -> None:
    """Two batches of 1024 prompt tokens: one chunk with no prefix, one after 3072 cached
    tokens. The GEMMs see the same 1024 tokens; attention computes e*p + e*(e+1)/2 pairs."""
    from cpkv.serving.cost.spec import CostSpec

    m = CostSpec(model="llama-3-8b", gpu="h100-sxm").build()
    no_prefix = 1024 * 0 + 1024 * 1025 // 2  # 524,800 pairs
    prefix = 1024 * 3072 + 1024 * 1025 // 2  # 3,670,528 pairs
    a = m.breakdown(1024, 0, 0, 1024, no_prefix, 0)
    b = m.breakdown(1024, 0, 0, 4096, prefix, 0)
    assert b[1:3] == a[1:3]  # same GEMM and elementwise time
    # compute-bound attention (per layer 16384 FLOPs per pair at 0.5 x 989.4 TFLOP/s: 17.4 us
    # vs 1024 x 4096 B of KV at 0.8 x 3.35 TB/s: 1.6 us), so its time scales with the pairs:
    assert b[3] / a[3] == pytest.approx(prefix / no_prefix, rel=1e-12)  # 6.994...
    assert b[0] - a[0] == pytest.approx(b[3] - a[3], rel=1e-12)
    assert b[0] > a[0]
