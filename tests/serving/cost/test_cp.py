"""CP shared-KV prefill in the roofline model (:mod:`cpkv.serving.cost.cp`): one iteration on
two ranks of the tiny model of ``test_roofline_hand`` worked out by hand, the reduction to the
roofline model on one rank, decode left alone, monotonicity in the cached tokens, the zigzag
split and the owner lanes, and the block's one-line refusals."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cpkv.core.schema import FieldError
from cpkv.serving.cost.cp import layout
from cpkv.serving.cost.cp.cost import CpRooflineCost, build_cp
from cpkv.serving.cost.cp.spec import CpSpec
from cpkv.serving.cost.cp.work import CpWork
from cpkv.serving.cost.roofline import RooflineCost
from cpkv.serving.cost.spec import CostSpec
from cpkv.serving.cost.stretch import AffinePieces
from tests.helpers.paths import MOONCAKE_TRACE
from tests.serving.cost.test_roofline_hand import CHIP, TINY

needs_trace = pytest.mark.skipif(not MOONCAKE_TRACE.is_file(), reason="no Mooncake trace")


def tiny_cp(size: int, **constants: float) -> CpRooflineCost:
    cp = CpSpec(size=size, **constants)  # type: ignore[arg-type]
    return build_cp(RooflineCost(TINY, CHIP), SimpleNamespace(cp=cp))


def test_a_prefill_on_two_ranks_by_hand() -> None:
    # the prefill of test_one_prefill_iteration_by_hand (20 tokens after 12 cached, 450 pairs,
    # the 12 loaded back) on 2 ranks, pages of 4, descriptors 0.5 us a page + 3 us,
    # load-back 0.25 us a page
    m = tiny_cp(2, page_size=4, descriptor_page_us=0.5, descriptor_fixed_us=3.0,
                load_back_page_us=0.25)  # fmt: skip
    parts = m.breakdown(20, 0, 0, 32, 450, 12)
    # a rank computes 10 tokens (padded to the 8-token tile: 16) and 225 pairs
    qkv = 1 + 0.524288  # C = 2*16*64*128/5e5 = 0.524288 > M = (16384 + 10*192*2)/5e4 = 0.40448
    out = 1 + 0.262144  # C = 2*16*64*64/5e5 > M = (8192 + 10*128*2)/5e4 = 0.21504
    up = 1 + 1.048576  # C = 2*16*64*256/5e5 > M = (32768 + 10*320*2)/5e4 = 0.78336
    down = 1 + 0.524288  # K=128, N=64: as QKV
    head = 1 + 0.66816  # the prompt's last token, as on one GPU
    gemm = 2 * (qkv + out + up + down) + head  # 2 * 6.359296 + 1.66816 = 14.386752
    elementwise = 2 * (2.5 + 10 * 2048 / 5e4)  # 2 * 2.9096 = 5.8192
    # attention per layer: max(4*16*4*225/2.5e5 = 0.2304, all 32 context tokens * 128 B / 5e4)
    attention = 2 * 0.2304
    # load-back: 12 tokens = 3 pages of 4 dealt round-robin, the fullest lane 2 pages = 8
    # tokens: 8 * 2 layers * 128 B / 500 B/us = 4.096, plus 2 pages * 0.25 us
    load = 4.096 + 0.5
    # all-gather of B bytes on 2 ranks: 2 us + (1/2) * B / (0.5 * 1e4 B/us), per layer;
    # the extend KV 20 * 128 = 2560 B (0.256), the cached prefix 12 * 128 = 1536 B (0.1536)
    exchange = 2 * (2 + 0.256)
    materialise = 2 * (2 + 0.1536)
    communication = exchange + materialise  # 8.8192
    # descriptors: 3 us + 0.5 us * 32 tokens / 4 = 8 pages; overhead_us 10
    overhead = 10.0 + 3.0 + 4.0
    total = gemm + elementwise + attention + communication + load + overhead
    assert total == pytest.approx(51.081952, rel=1e-12)
    assert parts[1:7] == pytest.approx(
        (gemm, elementwise, attention, communication, load, overhead), rel=1e-12
    )
    assert parts[0] == pytest.approx(total, rel=1e-12)
    assert m.batch_us(20, 0, 0, 32, 450, 12) == parts[0]
    assert parts[7] == 3_212_288  # the whole iteration's FLOPs (every rank's work)
    terms = m.terms(20, 0, 0, 32, 450, 12)
    assert terms == pytest.approx({
        "exchange_us": exchange, "materialise_us": materialise, "topk_us": 0.0,
        "load_back_us": 0.5, "descriptors_us": 7.0,
    }, rel=1e-12)  # fmt: skip


def test_ring_exchange_waits_only_for_what_attention_does_not_hide() -> None:
    ring = tiny_cp(2, kv_exchange="ring")
    gather = tiny_cp(2)
    # per layer: the gather 2.256 us against the rank's attention 0.2304 us: 2.0256 waited
    assert ring.terms(20, 0, 0, 32, 450, 0)["exchange_us"] == pytest.approx(2 * 2.0256)
    assert gather.terms(20, 0, 0, 32, 450, 0)["exchange_us"] == pytest.approx(2 * 2.256)


def test_one_rank_without_cached_token_constants_is_the_roofline_model() -> None:
    inner = RooflineCost(TINY, CHIP)
    work = build_cp(inner, SimpleNamespace(cp=CpSpec(size=2))).cp_work
    one = CpRooflineCost(inner, CpWork(
        size=1, layers=work.layers, token_bytes=work.token_bytes,
        link_gb_per_s=work.link_gb_per_s, regimes=work.regimes, score_write_us=0.0,
        score_pair_us=0.0,
        descriptor_page_us=0.0, descriptor_fixed_us=0.0, load_back_page_us=0.0,
    ))  # fmt: skip
    for args in [(20, 0, 0, 32, 450, 12), (7, 3, 60, 107, 700, 0), (0, 3, 60, 0, 0, 0)]:
        assert one.breakdown(*args) == inner.breakdown(*args)
        assert one.batch_us(*args) == inner.batch_us(*args)
    # and cp.size 1 (the default) builds the plain roofline model
    assert type(CostSpec().build()) is RooflineCost
    assert type(CostSpec(cp=CpSpec(size=2)).build()) is CpRooflineCost


def test_decode_is_the_roofline_models_and_its_stretch_closed_form() -> None:
    m = tiny_cp(4)
    inner = m.inner
    assert m.breakdown(0, 3, 60, 0, 0, 0) == inner.breakdown(0, 3, 60, 0, 0, 0)
    cp_stretch, bare = m.stretch(0, 3, 60, 0, 0, 0, 0), inner.stretch(0, 3, 60, 0, 0, 0, 0)
    assert isinstance(cp_stretch, AffinePieces) and cp_stretch.pieces == bare.pieces
    # a stretch with prefill tokens is looped over, each iteration the CP price
    looped = m.stretch(8, 2, 40, 20, 100, 8, 64)
    assert looped.duration(1) == m.batch_us(8, 2, 42, 28, 164, 0)


def test_breakdowns_of_many_iterations_are_the_breakdowns_of_each() -> None:
    m = tiny_cp(2, page_size=4)
    rows = [(20, 0, 0, 32, 450, 12), (0, 3, 60, 0, 0, 0), (9, 1, 5, 1000, 9000, 0)]
    arrays = [np.array(col, dtype=np.int64) for col in zip(*rows, strict=True)]
    columns = m.breakdowns(*arrays)
    for i, row in enumerate(rows):
        assert tuple(float(np.broadcast_to(c, (3,))[i]) for c in columns) == m.breakdown(*row)


def test_the_price_grows_with_the_cached_tokens() -> None:
    spec = CostSpec(model="deepseek-v3.2", gpu="h200", tp=8, cp=CpSpec(size=8))
    spec.validate()
    m = spec.build()
    extend, last = 2048, 0.0
    for cached in (0, 1024, 8192, 65536, 262144, 1048576):
        pairs = extend * cached + extend * (extend + 1) // 2
        t = m.batch_us(extend, 0, 0, cached + extend, pairs, 0)
        terms = m.terms(extend, 0, 0, cached + extend, pairs, 0)
        assert t > last
        assert terms["materialise_us"] >= 0 and terms["topk_us"] > 0
        last = t
    # the sparse top-k: 4-byte scores at the elementwise kernels' share of the H200's
    # 4.8 TB/s: the rank's 256 query rows of all 10,240 keys written, its pairs' scores read
    # twice, per layer
    eff = m.calibration.elementwise_bw_eff
    pairs = 2048 * 8192 + 2048 * 2049 // 2  # 18,875,392: 2,359,424 a rank
    write, read = 4 / (4800e3 * eff), 8 / (4800e3 * eff)
    assert m.terms(2048, 0, 0, 8192 + 2048, pairs, 0)["topk_us"] == pytest.approx(
        61 * (write * 256 * 10240 + read * 2359424), rel=1e-12
    )


def test_the_index_scores_make_a_batch_of_high_hit_requests_cost_more_than_its_parts() -> None:
    spec = CostSpec(model="deepseek-v3.2", gpu="h200", tp=8, cp=CpSpec(size=8))
    m = spec.build()
    # one request: 512 extend tokens after 32,768 cached; k of them in one batch
    one = m.terms(512, 0, 0, 33280, 512 * 32768 + 512 * 513 // 2, 0)["topk_us"]
    four = m.terms(2048, 0, 0, 4 * 33280, 4 * (512 * 32768 + 512 * 513 // 2), 0)["topk_us"]
    # the pairs' reads add up; the score rows do not: 256 rows of 133,120 keys against 4 x 64
    # rows of 33,280 (the matrix grows as k squared)
    write = m.cp_work.score_write_us
    assert four - 4 * one == pytest.approx(61 * write * (256 * 133120 - 4 * 64 * 33280))
    assert four > 1.5 * (4 * one)


def test_zigzag_split_balances_the_pairs_and_owner_lanes_deal_pages_round_robin() -> None:
    # 16 tokens on 2 ranks: segments of 4; rank 0 holds tokens 0-3 and 12-15, rank 1 4-11
    assert layout.zigzag_split(16, 2) == [8, 8]
    # after 10 cached tokens: rank 0: 4*10 + 10 + 4*22 + 10 = 148; rank 1: 4*14 + 10 + 4*18
    # + 10 = 148; together 16*10 + 16*17/2 = 296
    assert layout.zigzag_pairs(10, 16, 2) == [148, 148]
    assert layout.zigzag_split(17, 2) == [9, 8]
    assert sum(layout.zigzag_pairs(5, 17, 2)) == 17 * 5 + 17 * 18 // 2
    assert layout.round_robin_pages(10, 4) == [3, 3, 2, 2]
    assert layout.fullest_lane_pages(600, 64, 4) == 3  # 10 pages
    assert layout.l1_capacity_tokens(8192, 64, 8) == 8192 * 64 * 8


@pytest.mark.parametrize(
    ("spec", "key", "says"),
    [
        (CostSpec(cp=CpSpec(kv_exchange="ring")), "cp.kv_exchange", "size is 1"),
        (CostSpec(cp=CpSpec(size=2, kv_exchange="tree")), "cp.kv_exchange", "unknown value"),
        (CostSpec(cp=CpSpec(size=2), pp=2), "cp.size", "whole model"),
        (CostSpec(kind="linear", cp=CpSpec(size=2)), "cp", "belongs to kind roofline"),
    ],
)
def test_what_a_cp_block_cannot_say_is_named(spec, key, says) -> None:
    with pytest.raises(FieldError) as err:
        spec.validate()
    assert err.value.key == key and says in str(err.value)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("admit.cost.cp.size=0", "admit.cost.cp.size"),
        ("admit.cost.cp.descriptor_page_us=-1", "admit.cost.cp.descriptor_page_us"),
        ("admit.cost.cp.topk_passes=3", "admit.cost.cp.topk_passes: applies only"),
        ("admit.cost.cp.colour=1", "admit.cost.cp.colour: unknown key"),
    ],
)
def test_bad_cp_keys_are_refused_in_one_line(cli, override, says) -> None:
    res = cli("admit", "admit.mode=serving", override)
    assert res.exit_code == 2, res.output
    assert says in res.output
    assert "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


@needs_trace
def test_a_serving_run_on_cp_ranks_names_them_and_adds_up(cli) -> None:
    res = cli(
        "admit", "configs/admit/serving_mooncake.yaml", "admit.workload.limit=40",
        "admit.cost.model=deepseek-v3.2", "admit.cost.gpu=h200", "admit.cost.tp=8",
        "admit.cost.cp.size=4", "admit.cost.cp.kv_exchange=ring",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "CP prefill on 4 ranks (32 GPUs), KV ring" in res.output
    assert '"cp": {"size": 4, "kv_exchange": "ring"' in res.output


def test_the_all_gather_by_hand() -> None:
    from cpkv.serving.cost.allreduce import AllReduceRegimes, allgather_us

    regimes = AllReduceRegimes(latency_us=2.0, small_bw_eff=0.25, switch_bytes=1000, bw_eff=0.5)
    # 3,000 B on 4 GPUs over 1 GB/s (1e3 B/us): each sends 3/4 of it, the first 1,000 B at
    # 250 B/us (4 us), the other 2,000 B at 500 B/us (4 us): 2 + 0.75 * 8 = 8 us
    assert allgather_us(3000, 4, 1.0, regimes) == pytest.approx(8.0, rel=1e-12)
    assert allgather_us(3000, 1, 1.0, regimes) == 0.0
    assert allgather_us(0, 4, 1.0, regimes) == 0.0


@pytest.mark.parametrize("cp_size", [2, 3, 4, 8])
def test_round_robin_owners_fill_lane_0_first_one_page_per_stripe(cp_size) -> None:
    # seed 003's round_robin owner pattern: a request's page i on lane i mod cp_size; deal
    # requests that grow page by page and count each lane; lane 0 is always the fullest and
    # holds, of every request, one page per started stripe of cp_size pages
    rng = np.random.default_rng(cp_size)
    lanes = [0] * cp_size
    stripes = 0
    page_tokens = 64
    for _ in range(50):
        tokens = int(rng.integers(1, 5000))
        pages = -(-tokens // page_tokens)
        for i in range(pages):
            lanes[i % cp_size] += 1
        block_tokens, _ = layout.lane_pool(100, page_tokens, cp_size)
        stripes += -(-tokens // block_tokens)
        assert max(lanes) == lanes[0] == stripes
        assert -(-tokens // block_tokens) == layout.fullest_lane_pages(tokens, page_tokens, cp_size)
    assert layout.lane_pool(100, page_tokens, cp_size) == (page_tokens * cp_size, 100)


LANES = (
    "configs/admit/serving_mooncake.yaml", "admit.workload.limit=60", "admit.engine=cpkv",
    "admit.cost.cp.size=4", "admit.cost.cp.page_size=64",
)  # fmt: skip


@needs_trace
def test_the_owner_lanes_size_the_serving_pool(cli) -> None:
    # 80 pages a lane on 4 lanes of 64-token pages: the pool of 80 stripes of 256 tokens,
    # decision for decision (small enough that requests are preempted and rejected)
    # (the config's own admit.kv set back to the defaults: the lanes alone size the pool)
    lanes = cli("admit", *LANES, "admit.cost.cp.l1_pages_per_rank=80",
                "admit.kv.block_size=4", "admit.kv.capacity_blocks=4")  # fmt: skip
    assert lanes.exit_code == 0, lanes.output
    assert (
        "KV pool 80 blocks x 256 tokens (admit.cost.cp: the shared paged L1 pool's 4 owner lanes"
        in lanes.output
    )
    stripes = cli("admit", *LANES, "admit.kv.block_size=256", "admit.kv.capacity_blocks=80")
    assert stripes.exit_code == 0, stripes.output
    a, b = cli.run_dirs()
    assert (a / "requests.jsonl").read_text() == (b / "requests.jsonl").read_text()
    summary = cli.results(a)["summary"]
    assert summary["preemptions_by_reason"] and summary["rejected_by_reason"]
    both = cli("admit", *LANES, "admit.cost.cp.l1_pages_per_rank=80",
               "admit.kv.block_size=256", "admit.kv.capacity_blocks=80")  # fmt: skip
    assert both.exit_code == 0, both.output  # the same pool given twice is accepted


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ("admit.kv.capacity_blocks=300",),
            "admit.kv.capacity_blocks: 300 blocks x 4 tokens, but cost.cp.l1_pages_per_rank "
            "sizes the pool as 300 blocks x 256 tokens",
        ),
        ((), "set admit.kv.block_size=256 admit.kv.capacity_blocks=300"),
        (
            ("admit.engine=sglang",),
            "admit.cost.cp.l1_pages_per_rank: the CP owner lanes size cpkv's loop",
        ),
        (("admit.cost.cp.size=1",), "admit.cost.cp.l1_pages_per_rank: applies only"),
    ],
)
def test_owner_lanes_beside_another_pool_are_refused_in_one_line(cli, overrides, says) -> None:
    res = cli("admit", "configs/admit/serving_mooncake.yaml", "admit.cost.cp.size=4",
              "admit.cost.cp.l1_pages_per_rank=300", "admit.kv.block_size=4", *overrides)  # fmt: skip
    assert res.exit_code == 2, res.output
    assert says in res.output
    assert len(res.output.strip().splitlines()) == 1
