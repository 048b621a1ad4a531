"""The serving engine under SGLang's loop (``admit.engine: sglang``): times derived by
hand, decisions and times equal to the loop model's own scenario runner (which the
differential suite checks against the real loop), and the config refusals."""

from __future__ import annotations

import json
import random
from functools import partial
from pathlib import Path

import pytest

from cpkv.serving.cost.model import CostModel
from cpkv.serving.engine.sglang_engine import SglangEngine, SglangSettings
from cpkv.serving.engine.simulate import KeepRequests
from cpkv.serving.model.request import FINISHED, Req
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.sglang import LoopConfig, run_scenario

FIXED, PER_TOKEN, PER_DECODE = 1000.0, 20.0, 50.0
COST = CostModel(
    fixed_us=FIXED, prefill_token_us=PER_TOKEN, decode_request_us=PER_DECODE, context_token_us=0.0
)

SGLANG_SYNTHETIC = (
    "admit", "admit.mode=serving", "admit.engine=sglang", "admit.workload.source=synthetic",
)  # fmt: skip
"""A serving run under SGLang's loop of requests drawn by the synthetic source."""


def serve(reqs: list[Req], trace_block: int | None = None, **knobs) -> list[Req]:
    config = LoopConfig(**{"max_total_num_tokens": 8192, "max_running_requests": 64,
                           "context_len": 8192, **knobs})  # fmt: skip
    settings = SglangSettings(config, COST, trace_block)
    sink = KeepRequests()
    samples = IterationLog(settings.capacity_blocks, settings.block_size, keep=True, cost=COST)
    SglangEngine(settings, sink=sink, samples=samples, arrivals=reqs).run()
    return sink.in_input_order()


def req(index: int, prompt: int, new: int, at_ms: float = 0.0, hashes=None) -> Req:
    return Req(index, f"r{index}", at_ms * 1000, prompt, new, hash_ids=hashes)


def test_one_request_prefills_then_decodes_one_token_a_batch() -> None:
    (r,) = serve([req(0, 100, 4)])
    prefill = FIXED + PER_TOKEN * 100
    decode = FIXED + PER_DECODE
    assert r.state == FINISHED and r.generated == 4
    assert r.first_token_us == pytest.approx(prefill)
    assert r.finished_us == pytest.approx(prefill + 3 * decode)


def test_a_prompt_that_arrives_while_others_decode_stalls_them() -> None:
    # SGLang's default (mixed chunk off): the second request's prefill runs alone, so the
    # first request's next token waits for it
    a, b = serve(
        [req(0, 50, 10), req(1, 400, 2, at_ms=3.0)], chunked_prefill_size=8192, overlap=False
    )
    first_prefill = FIXED + PER_TOKEN * 50  # 2.0 ms
    decode = FIXED + PER_DECODE  # 1.05 ms
    # b arrives at 3 ms, during a's first decode (2.0 .. 3.05 ms): it prefills next, alone
    assert b.first_token_us == pytest.approx(first_prefill + decode + FIXED + PER_TOKEN * 400)
    # a's tokens: 2.0, 3.05, then nothing until b's prefill ends at 12.05; one batch decodes
    # both (b's last token), then a decodes its last 7 alone
    both, alone = FIXED + 2 * PER_DECODE, FIXED + PER_DECODE
    assert b.finished_us == pytest.approx(b.first_token_us + both)
    assert a.finished_us == pytest.approx(b.first_token_us + both + 7 * alone)


def test_a_trace_request_hits_the_blocks_another_left_in_the_tree() -> None:
    # trace blocks of 64 tokens: b shares a's first two blocks; a's prompt entered the radix
    # cache after its prefill, so b computes only what follows them
    a = req(0, 200, 30, hashes=(1, 2, 3, 4))
    b = req(1, 200, 2, at_ms=20.0, hashes=(1, 2, 9, 10))
    ra, rb = serve([a, b], trace_block=64)
    assert ra.l1_hit == 0 and rb.l1_hit == 128
    assert rb.prefilled == 72
    off_a, off_b = serve(
        [req(0, 200, 30, hashes=(1, 2, 3, 4)), req(1, 200, 2, at_ms=20.0, hashes=(1, 2, 9, 10))],
        trace_block=64, disable_radix_cache=True,
    )  # fmt: skip
    assert off_b.l1_hit == 0 and off_b.prefilled == 200


def test_a_prompt_that_cannot_fit_the_pool_is_rejected_and_outputs_are_clipped() -> None:
    big, long_output = serve([req(0, 9000, 2), req(1, 100, 100_000)], max_total_num_tokens=8192)
    assert big.reject_reason == "exceeds_kv_capacity"
    # SGLang clips max_new_tokens to the pool (8192 - 100 - 1 - 1) and to the context
    # (8192 - 100 - 1): the request is served, not rejected
    assert long_output.state == FINISHED and long_output.generated == 8090


@pytest.mark.parametrize("seed", range(40))
def test_decisions_and_times_are_those_of_the_loop_models_scenario_runner(seed) -> None:
    # the engine and the scenario runner drive the same loop model with their own clock and
    # arrival handling: with the same linear cost, every request's first token and finish
    # must agree (the runner's records are what the differential compares with SGLang's)
    rng = random.Random(seed)
    knobs = {
        "max_total_num_tokens": rng.choice((900, 2000, 8000)),
        "max_running_requests": rng.choice((4, 64)),
        "context_len": 8192,
        "chunked_prefill_size": rng.choice((None, 256, 1024)),
        "max_prefill_tokens": rng.choice((512, 16384)),
        "enable_mixed_chunk": rng.random() < 0.5,
        "overlap": rng.random() < 0.5,
        "disable_radix_cache": rng.random() < 0.5,
    }
    t, specs, reqs = 0.0, [], []
    for i in range(rng.randint(2, 14)):
        t += rng.choice((0.0, rng.uniform(0, 5), rng.uniform(5, 200)))
        prompt, new = rng.randint(10, 400), rng.randint(1, 150)
        specs.append({"rid": f"r{i}", "arrival_ms": t, "len": prompt, "max_new_tokens": new})
        reqs.append(req(i, prompt, new, at_ms=t))
    scenario = {
        "kv_size": knobs["max_total_num_tokens"], "max_running_requests": knobs["max_running_requests"],
        "context_len": 8192, "chunked_prefill_size": knobs["chunked_prefill_size"],
        "max_prefill_tokens": knobs["max_prefill_tokens"],
        "enable_mixed_chunk": knobs["enable_mixed_chunk"], "overlap": knobs["overlap"],
        "disable_radix_cache": knobs["disable_radix_cache"],
        "cost": {"fixed_us": FIXED, "prefill_token_us": PER_TOKEN, "decode_req_us": PER_DECODE},
        "requests": specs,
    }  # fmt: skip
    expected = run_scenario(scenario)["requests"]
    for r in serve(reqs, **knobs):
        e = expected[r.rid]
        assert r.first_token_us == pytest.approx(e["first_token_us"], rel=1e-12)
        assert r.finished_us == pytest.approx(e["finish_us"], rel=1e-12)
        assert r.generated == e["output_len"]
        assert r.preemptions == e.get("retractions", 0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("admit.policy=iteration", "admit.policy: 'iteration' is a seed 004 policy"),
        ("admit.schedule_policy=deadline", "admit.schedule_policy"),
        ("admit.serving.on_preempt=swap", "admit.serving: admit.serving's options are cpkv's"),
        (
            "admit.cp.max_batch_requests=4",
            "admit.cp: SGLang's loop applies the CP shared-KV limits only",
        ),
        ("admit.page_size=16 admit.chunked_prefill_size=8", "less than a page"),
        ("admit.sglang.schedule_conservativeness=0", "admit.sglang.schedule_conservativeness"),
        (
            "admit.sglang.enable_hierarchical_cache=true admit.sglang.disable_radix_cache=true",
            "admit.sglang.enable_hierarchical_cache: the host tier keeps the radix cache's nodes",
        ),
        ("admit.workload.cache.l1_tokens=null", "admit.workload.cache.l1_tokens: null"),
        (
            "admit.cluster.instances=2 admit.cluster.shared_l2=true",
            "admit.cluster.shared_l2: one L2 shared by the instances is cpkv's loop's",
        ),
        (
            "admit.workload.cache.l1_tokens=1000 admit.workload.cache.hicache_ratio=null",
            "admit.workload.cache.l2_tokens: an unlimited L2",
        ),
        (
            "admit.workload.cache.l1_tokens=1000 admit.workload.cache.l2_tokens=9000 "
            "admit.sglang.enable_hierarchical_cache=true",
            "admit.sglang.enable_hierarchical_cache: the host tier is given twice",
        ),
    ],
)
def test_bad_sglang_config_is_one_line(cli, override, message) -> None:
    res = cli(
        *SGLANG_SYNTHETIC, "admit.workload.synthetic.count=4", *override.split(),
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1


def _run(reqs: list[Req], stretches: bool, trace_block: int | None, **knobs):
    config = LoopConfig(**knobs)
    settings = SglangSettings(config, ROOFLINE, trace_block)
    sink = KeepRequests()
    samples = IterationLog(settings.capacity_blocks, settings.block_size, keep=True, cost=ROOFLINE)
    engine = SglangEngine(settings, sink=sink, samples=samples, arrivals=reqs, stretches=stretches)
    res = engine.run()
    return sink.in_input_order(), res, samples.kept


NO_FIXED_HITS = (
    "admit.workload.synthetic.l1_cached_tokens.choices=[0]",
    "admit.workload.synthetic.l2_cached_tokens.choices=[0]",
)


def sglang_run(cli, count: int, *overrides: str) -> Path:
    """The run directory of a successful serving run under SGLang's loop of ``count``
    synthetic requests without fixed hits."""
    res = cli(
        *SGLANG_SYNTHETIC, f"admit.workload.synthetic.count={count}", *NO_FIXED_HITS, *overrides
    )
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    return run


ROOFLINE = None  # set below (the default cost model: decode iterations on a line in context)


@pytest.mark.parametrize("seed", range(30))
def test_closed_form_decode_stretches_change_no_decision(seed) -> None:
    # the same workload with every pass run in full and with quiet decode passes jumped
    # over: every request's times (to rounding), tokens, hits and retractions, the number
    # of iterations and the logged samples must agree
    global ROOFLINE
    if ROOFLINE is None:
        from cpkv.serving.cost.spec import CostSpec

        ROOFLINE = CostSpec().build()
    rng = random.Random(1000 + seed)
    page = rng.choice((1, 1, 4, 16))
    knobs = {
        "max_total_num_tokens": rng.choice((3000, 8000, 40000)) // page * page,
        "max_running_requests": rng.choice((4, 16, 64)),
        "context_len": 16384,
        "chunked_prefill_size": rng.choice((None, 512, 2048)),
        "max_prefill_tokens": rng.choice((1024, 16384)),
        "page_size": page,
        "enable_mixed_chunk": rng.random() < 0.5,
        "overlap": rng.random() < 0.5,
        "disable_radix_cache": rng.random() < 0.3,
    }
    if not knobs["disable_radix_cache"] and rng.random() < 0.5:
        knobs["hicache_tokens"] = rng.choice((2000, 20000)) // page * page  # (a host tier)
    trace_block = rng.choice((None, 32))

    def workload() -> list[Req]:
        r2 = random.Random(seed)
        t, out = 0.0, []
        for i in range(r2.randint(3, 25)):
            t += r2.choice((0.0, r2.uniform(0, 20), r2.uniform(20, 400)))
            prompt = r2.randint(10, 600)
            hashes = (
                tuple(r2.randint(1, 4) for _ in range(prompt // 32 + 1)) if trace_block else None
            )
            out.append(req(i, prompt, r2.randint(1, 400), at_ms=t, hashes=hashes))
        return out

    full, res_full, kept_full = _run(workload(), False, trace_block, **knobs)
    fast, res_fast, kept_fast = _run(workload(), True, trace_block, **knobs)
    assert res_fast.iterations == res_full.iterations
    for a, b in zip(full, fast, strict=True):
        assert (a.state, a.generated, a.preemptions, a.l1_hit, a.prefilled) == (
            b.state, b.generated, b.preemptions, b.l1_hit, b.prefilled,
        )  # fmt: skip
        for field in ("first_token_us", "finished_us", "admitted_us"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-9, abs=1e-6)
    assert len(kept_full[0]) == len(kept_fast[0])
    assert kept_fast[2] == kept_full[2]  # KV used, iteration by iteration


def test_a_high_priority_request_preempts_the_latest_low_priority_one_when_the_batch_is_full():
    # two request slots; a and b (priority 0) decode; c (priority 50, higher values first,
    # threshold 10) arrives: the batch is full, so preempt_to_schedule frees the running
    # request queued last (b) and c is admitted in the pass it arrives for; b waits again
    a, b = req(0, 100, 200), req(1, 100, 200, at_ms=1.0)
    c = req(2, 100, 5, at_ms=30.0)
    c.priority = 50
    ra, rb, rc = serve(
        [a, b, c], max_running_requests=2, enable_priority_scheduling=True, overlap=False,
        chunked_prefill_size=None,
    )  # fmt: skip
    assert (ra.preemptions, rb.preemptions, rc.preemptions) == (0, 1, 0)
    assert rc.admitted_us < 31_000  # the first pass after 30 ms (a decode pass takes ~1.1 ms)
    assert rb.finished_us > rc.finished_us and ra.state == rb.state == rc.state == FINISHED
    without = serve(
        [req(0, 100, 200), req(1, 100, 200, at_ms=1.0), req(2, 100, 5, at_ms=30.0)],
        max_running_requests=2, overlap=False, chunked_prefill_size=None,
    )  # fmt: skip
    assert without[2].admitted_us >= without[0].finished_us  # no slot until a leaves


def test_cp_limits_on_top_of_the_loop_cap_each_prefill_batch():
    # cpkv's CP shared-KV limits (not SGLang's), applied to SGLang's loop when asked: six
    # 100-token requests at once fill one prefill batch without them; with at most 2
    # requests a batch they need three prefill batches (a request alone is never stopped)
    from cpkv.admission.cp_limit import cp_limit_broken

    reqs = [req(i, 100, 3) for i in range(6)]
    plain = serve(reqs, overlap=False)
    assert len({r.admitted_us for r in plain}) == 1
    capped = partial(
        cp_limit_broken, max_requests=2, max_extend_tokens=None, max_cached_tokens=None
    )
    limited = serve([req(i, 100, 3) for i in range(6)], overlap=False, cp_limit=capped)
    starts = sorted({r.admitted_us for r in limited})
    assert len(starts) == 3
    assert [sum(r.admitted_us == t for r in limited) for t in starts] == [2, 2, 2]


def test_the_host_tier_loads_back_a_prefix_evicted_from_the_device():
    # trace blocks of 64: a (256 tokens) finishes; b (800, its own blocks) needs the device
    # pool (1024 tokens) and evicts a, which the host tier keeps; c shares a's four blocks and
    # loads them back (its L2 hit) instead of computing them; without the tier it computes all
    a = req(0, 256, 2, hashes=(1, 2, 3, 4))
    b = req(1, 800, 2, at_ms=50.0, hashes=tuple(range(100, 113)))
    c = req(2, 300, 2, at_ms=200.0, hashes=(1, 2, 3, 4, 9))
    knobs = {"max_total_num_tokens": 1024, "overlap": False}
    _, _, with_host = serve([a, b, c], trace_block=64, hicache_tokens=4096, **knobs)
    assert (with_host.l1_hit, with_host.l2_hit, with_host.prefilled) == (0, 256, 44)
    _, _, without = serve(
        [req(0, 256, 2, hashes=(1, 2, 3, 4)), req(1, 800, 2, at_ms=50.0, hashes=tuple(range(100, 113))),
         req(2, 300, 2, at_ms=200.0, hashes=(1, 2, 3, 4, 9))],
        trace_block=64, **knobs,
    )  # fmt: skip
    assert (without.l1_hit, without.l2_hit, without.prefilled) == (0, 0, 300)


def test_a_given_l1_l2_cache_joins_the_pool_and_becomes_the_host_tier(cli) -> None:
    # cpkv's loop keeps L1 as a partition beside the running requests' 4096 x 16 tokens;
    # SGLang's loop has one pool: 65,536 + 10,000 tokens; the L2 of 50,000 is its host tier
    run = sglang_run(
        cli, 4, "admit.kv.capacity_blocks=4096", "admit.kv.block_size=16",
        "admit.workload.cache.l1_tokens=10000", "admit.workload.cache.l2_tokens=50000",
    )  # fmt: skip
    sglang = cli.results(run)["summary"]["sglang"]
    assert (sglang["max_total_num_tokens"], sglang["hicache_tokens"]) == (75_536, 50_000)


def test_a_prompt_at_the_context_length_is_rejected_and_its_line_names_why(cli) -> None:
    # SGLang refuses a prompt that reaches context_len (its tokenizer manager's check): the
    # request ends at once, counted and written with that reason
    run = sglang_run(
        cli, 3, "admit.workload.synthetic.extend_tokens.choices=[64]", "admit.sglang.context_len=64",
        "admit.kv.capacity_blocks=4096", "admit.kv.block_size=16",
    )  # fmt: skip
    lines = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    assert [(x["status"], x["reason"]) for x in lines] == [("rejected", "exceeds_context_len")] * 3
    assert cli.results(run)["summary"]["rejected_by_reason"] == {"exceeds_context_len": 3}


def test_priority_scheduling_is_read_from_the_admit_block(cli) -> None:
    run = sglang_run(cli, 4, "admit.enable_priority_scheduling=true")
    assert cli.results(run)["summary"]["engine"] == "sglang"


@pytest.mark.parametrize(
    ("overrides", "engine", "why"),
    [
        ((*NO_FIXED_HITS,), "sglang", None),
        ((*NO_FIXED_HITS, "admit.policy=iteration"), "cpkv", "admit.policy: 'iteration'"),
        ((*NO_FIXED_HITS, "admit.serving.queue_timeout_ms=500"), "cpkv", "admit.serving:"),
        ((*NO_FIXED_HITS, "admit.schedule_policy=deadline"), "cpkv", "admit.schedule_policy:"),
        ((), "cpkv", "admit.workload.synthetic.l1_cached_tokens draws cached tokens"),
    ],
    ids=["sglang-loop", "seed-004-policy", "serving-option", "cpkv-order", "fixed-hits"],
)
def test_a_null_engine_is_sglangs_loop_unless_the_config_needs_cpkvs(
    cli, overrides, engine, why
) -> None:
    res = cli(
        "admit", "admit.mode=serving", "admit.workload.source=synthetic",
        "admit.workload.synthetic.count=4", *overrides,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    results = cli.results(run)
    assert results["summary"]["engine"] == engine
    said = [n for n in results["notes"] if "cannot run this config" in n]
    if why is None:
        assert not said
    else:
        assert len(said) == 1 and why in said[0], said


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("admit.engine=sglang",),
            "admit.workload: request",  # the grid's fixed hits (a prefill-model workload)
        ),
        (
            ("admit.engine=vllm", "admit.workload.synthetic.count=4"),
            "admit.workload: admit.workload.synthetic.l1_cached_tokens draws cached tokens",
        ),
        (
            ("admit.sglang.enable_mixed_chunk=true", "admit.policy=iteration"),
            "admit.sglang: SGLang's loop's server arguments, but SGLang's loop cannot run",
        ),
    ],
    ids=["sglang-grid-hits", "vllm-synthetic-hits", "sglang-keys-in-cpkvs-loop"],
)
def test_what_only_cpkvs_loop_runs_is_refused_elsewhere_in_one_line(cli, overrides, message):
    source = () if "admit.engine=sglang" in overrides else ("admit.workload.source=synthetic",)
    res = cli("admit", "admit.mode=serving", *source, *overrides)
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1


def test_cpkvs_loop_serves_only(cli) -> None:
    res = cli("admit", "admit.engine=cpkv")
    assert res.exit_code == 2
    assert "admit.engine: cpkv's loop serves in admit.mode serving" in res.output
