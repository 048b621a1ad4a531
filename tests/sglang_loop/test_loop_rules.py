"""The SGLang loop model on hand-built scenarios whose outcome is known without running it:
derived by hand from SGLang's rules, or measured on the real loop and published in the loop
oracle's README (``../shared/oracle/sglang_loop/README.md``: its selftest and its first
comparison with cpkv). Runs everywhere (no sglang needed)."""

from __future__ import annotations

import pytest

from cpkv.sglang import run_scenario
from cpkv.sglang.radix import RadixTree

COST = {"fixed_us": 1000.0, "prefill_token_us": 20.0, "decode_req_us": 50.0}


def run(**scenario) -> dict:
    return run_scenario({"cost": COST, **scenario})


def extends(result: dict, rid: str) -> list[tuple[int, int]]:
    return [(p, e) for t in result["trace"] for r, p, e in t["extend"] if r == rid]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_queue_over_one_batch_prefills_first_in_batches_the_input_budget_allows(overlap):
    # 10 x 500 tokens, max_prefill_tokens 2048, no chunking: 4 x 500 = 2000 fit, the fifth's
    # 500 >= the 48 left stops the pass (rem_input_tokens); the decodes wait for the queue
    res = run(
        kv_size=65536, max_prefill_tokens=2048, chunked_prefill_size=None, overlap=overlap,
        requests=[{"rid": f"q{i}", "len": 500, "max_new_tokens": 6} for i in range(10)],
    )  # fmt: skip
    kinds = [t["kind"] for t in res["trace"]]
    assert kinds[:4] == ["prefill", "prefill", "prefill", "decode"]
    assert [len(t["extend"]) for t in res["trace"][:3]] == [4, 4, 2]
    assert len(res["trace"][3]["decode"]) == 10
    assert all(st["output_len"] == 6 for st in res["requests"].values())


@pytest.mark.parametrize("mixed, chunks", [(False, [1024, 1024, 952]), (True, [1022, 1022, 956])])
def test_a_long_prompt_chunks_alone_or_shrinks_by_the_decode_rows(mixed, chunks):
    # two 64-token requests decode; a 3000-token prompt arrives at 4 ms (chunk 1024): mixed
    # chunk off, SGLang's default, runs the chunks alone and stalls the decodes; on, the two
    # decodes ride along and take two tokens of each chunk's budget
    res = run(
        kv_size=16384, chunked_prefill_size=1024, enable_mixed_chunk=mixed,
        requests=[
            {"rid": "a", "len": 64, "max_new_tokens": 12},
            {"rid": "b", "len": 64, "max_new_tokens": 12},
            {"rid": "long", "len": 3000, "arrival_ms": 4, "max_new_tokens": 3},
        ],
    )  # fmt: skip
    rows = extends(res, "long")
    assert [e for _, e in rows] == chunks
    assert [p for p, _ in rows] == [0, chunks[0], 2 * chunks[0]]
    batches = [t for t in res["trace"] if any(r == "long" for r, _, _ in t["extend"])]
    if mixed:
        assert all(t["kind"] == "mixed" and len(t["decode"]) == 2 for t in batches)
    else:
        assert all(t["kind"] == "prefill" and not t["decode"] for t in batches)
    assert [t["chunked"] for t in batches] == ["long", "long", None]
    assert len({t["ratio"] for t in batches}) == 1  # no decay outside decode batches


def test_decode_retracts_the_request_with_the_fewest_outputs_and_reestimates_the_ratio():
    # a 1024-token pool, 5 x (150 + 300), conservativeness 0.3 (ratio 0.21): the real loop
    # retracts r2 at a decode step and sets the ratio to (2 * 192 + 20 * 2) / (2 * 300 + 1)
    res = run(
        kv_size=1024, schedule_conservativeness=0.3,
        requests=[{"rid": f"r{i}", "len": 150, "max_new_tokens": 300} for i in range(5)],
    )  # fmt: skip
    retracting = [t for t in res["trace"] if t["retracted"]]
    first = retracting[0]
    assert first["retracted"] == ["r2"] and first["kind"] == "decode"
    assert first["ratio"] == pytest.approx((2 * 192 + 20 * 2) / 601, abs=1e-6)
    # r2 comes back with its 192 outputs to prefill again (150 + 192 tokens)
    again = [(p, e) for t in res["trace"][first["it"] :] for r, p, e in t["extend"] if r == "r2"]
    assert again[0][0] + again[0][1] == 150 + 192
    assert res["requests"]["r2"]["retractions"] >= 1
    assert all(st["output_len"] == 300 for st in res["requests"].values())


def test_no_token_latches_admission_until_a_running_request_leaves():
    # r0 (100 + 1500) runs; r1 (1000 + 500) arrives at 5 ms and does not fit the 2400-token
    # pool beside r0's reservation: NO_TOKEN sets batch_is_full and no admission is tried
    # again until r0 finishes; the real loop gives r1 its first token at 1593 ms
    res = run(
        kv_size=2400,
        requests=[
            {"rid": "r0", "len": 100, "max_new_tokens": 1500},
            {"rid": "r1", "len": 1000, "max_new_tokens": 500, "arrival_ms": 5},
        ],
    )  # fmt: skip
    r0, r1 = res["requests"]["r0"], res["requests"]["r1"]
    assert r1["first_token_us"] > r0["finish_us"]
    assert (r1["first_token_us"] - r1["arrival_us"]) / 1000 == pytest.approx(1593, abs=1)


def test_a_prompt_enters_the_tree_after_its_prefill_and_a_later_one_hits_it():
    # the radix cache: b arrives while a (same 256-token prefix) is still decoding and
    # reuses the prefix a's prefill put in the tree; with the cache off it computes it all
    shared = list(range(1, 257))
    spec = [
        {"rid": "a", "ids": shared + list(range(1000, 1064)), "max_new_tokens": 50},
        {"rid": "b", "ids": shared + list(range(2000, 2032)), "max_new_tokens": 5,
         "arrival_ms": 10},
    ]  # fmt: skip
    on = run(kv_size=8192, requests=spec)
    off = run(kv_size=8192, requests=spec, disable_radix_cache=True)
    assert extends(on, "b") == [(256, 32)]
    assert extends(off, "b") == [(0, 288)]


def test_the_overlap_loop_hands_a_finished_requests_kv_to_the_tree_one_step_later():
    # a (100 + 3) and b (40 + 8) prefill together. a's third token is never fed back, so it
    # leaves 102 tokens to the tree (evictable) and b keeps its 40 locked. The normal loop
    # does that before the next batch; the overlap loop processes a's last result after the
    # next batch was launched, so that batch still sees a's 102 tokens protected
    spec = [
        {"rid": "a", "len": 100, "max_new_tokens": 3},
        {"rid": "b", "len": 40, "max_new_tokens": 8},
    ]
    normal = run(kv_size=4096, requests=spec, overlap=False)
    overlap = run(kv_size=4096, requests=spec, overlap=True)
    for result in (normal, overlap):
        assert [len(t["decode"]) for t in result["trace"][1:4]] == [2, 2, 1]
        assert result["requests"]["a"]["output_len"] == 3
    after_normal, after_overlap = normal["trace"][3], overlap["trace"][3]
    assert (after_normal["evictable"], after_normal["protected"]) == (102, 40)
    assert (after_overlap["evictable"], after_overlap["protected"]) == (0, 140)
    assert (overlap["trace"][4]["evictable"], overlap["trace"][4]["protected"]) == (102, 40)


def test_ignore_eos_keeps_room_for_every_running_requests_whole_output():
    # radix cache off, a 1900-token pool: three 100 + 400 requests run; a fourth arrives at
    # 20 ms, when each has 12 outputs (1564 slots free). The plain path reserves the running
    # requests' 388 tokens left x ratio 0.7 (815) and admits it (501 < 749); SGLang's
    # ignore_eos path needs room for all outputs in full (4 x ~390 > 1463) and refuses
    spec = [{"rid": f"r{i}", "len": 100, "max_new_tokens": 400} for i in range(3)]
    spec.append({"rid": "r3", "len": 100, "max_new_tokens": 400, "arrival_ms": 20})
    plain = run(kv_size=1900, disable_radix_cache=True, requests=spec)
    eos = run(
        kv_size=1900, disable_radix_cache=True,
        requests=[{**r, "ignore_eos": True} for r in spec],
    )  # fmt: skip
    late = [t for t in plain["trace"] if any(r == "r3" for r, _, _ in t["extend"])][0]
    assert late["t_ms"] == pytest.approx(20.8, abs=0.01)  # 7 ms prefill + 12 decodes of 1.15 ms
    assert plain["requests"]["r3"]["first_token_us"] < plain["requests"]["r0"]["finish_us"]
    assert eos["requests"]["r3"]["first_token_us"] > eos["requests"]["r0"]["finish_us"]


def test_the_ratio_decays_only_in_decode_batches_and_resets_when_idle():
    # init 0.7, floor 0.7 x 0.14 = 0.098, decay (0.7 - 0.098) / 600 per decode pass (before
    # the batch launches); prefill batches leave it alone; an idle server resets it
    decay = (0.7 - 0.098) / 600
    res = run(
        kv_size=8192, chunked_prefill_size=256, overlap=False,
        requests=[
            {"rid": "a", "len": 32, "max_new_tokens": 12},
            {"rid": "b", "len": 600, "arrival_ms": 5, "max_new_tokens": 3},
            {"rid": "c", "len": 32, "arrival_ms": 500, "max_new_tokens": 2},
        ],
    )  # fmt: skip
    decodes = 0
    for t in res["trace"]:
        if t["extend"] and any(r == "c" for r, _, _ in t["extend"]):
            assert t["ratio"] == pytest.approx(0.7, abs=1e-6)  # reset while idle
            break
        decodes += t["kind"] == "decode"
        assert t["ratio"] == pytest.approx(0.7 - decodes * decay, abs=1e-6)
    assert decodes > 5


def test_a_tokens_kv_slot_is_taken_when_it_is_fed_back():
    # one request of 100 + 5 in a 1000-token pool: its prefill holds 100 slots; each decode
    # batch feeds the previous token back and takes its slot, so the k-th decode launches
    # with 100 + k slots taken; its last token is never fed back (100 + 4 at the end)
    res = run(kv_size=1000, overlap=False, requests=[{"rid": "a", "len": 100, "max_new_tokens": 5}])
    avail = [t["avail"] for t in res["trace"]]
    assert avail == [900, 899, 898, 897, 896]
    assert res["final"]["evictable"] == 104 and res["final"]["avail"] == 896


@pytest.mark.parametrize(
    ("host_tokens", "c_row"),
    [(None, (0, 350)), (2000, (300, 50)), (1000, (0, 350))],
    ids=["no host tier", "host holds both", "host evicts the older"],
)
def test_the_host_tier_keeps_an_evicted_prefix_and_loads_it_back(host_tokens, c_row):
    # cpkv's host tier (SGLang's HiCache, write-through), not in the oracle: a's 300-token
    # prompt (and its fed-back output) is copied to the host when inserted; b's 800-token
    # prefill evicts a from the 1000-token device pool, which demotes it to the host; c
    # (a's prompt + 50) then loads the 300 back instead of computing them. A 1000-token host
    # cannot hold b's 800 beside a's 301: copying b evicts a's host copy first (LRU)
    prompt = list(range(1, 301))
    res = run(
        kv_size=1000, overlap=False, hicache_tokens=host_tokens,
        requests=[
            {"rid": "a", "ids": prompt, "max_new_tokens": 2},
            {"rid": "b", "len": 800, "arrival_ms": 20, "max_new_tokens": 2},
            {"rid": "c", "ids": prompt + list(range(5000, 5050)), "arrival_ms": 100,
             "max_new_tokens": 2},
        ],
    )  # fmt: skip
    assert extends(res, "c") == [c_row]
    if c_row[0]:  # the loaded prefix is c's (locked), b's 800 + 1 were evicted to make room
        c_prefill = [t for t in res["trace"] if t["extend"] and t["extend"][0][0] == "c"][0]
        assert c_prefill["protected"] == 300 and c_prefill["avail"] == 1000 - 300 - 50


def test_a_device_node_whose_children_went_to_the_host_stays_evictable_after_a_match():
    # Host tier on. a (tokens 0-9) then a + b (0-19): the tree holds a -> b, both on the
    # device and copied to the host. Evicting one leaf demotes b (it keeps its host copy), so
    # a is a device leaf now (its only child is on the host). A match of 0-19 walks a into
    # host-only b and touches a; evicting everything must still free a's 10 device tokens.
    freed: list[int] = []
    tree = RadixTree(1, False, freed.append, host_tokens=1000)
    tree.insert(list(range(10)), 0)
    tree.insert(list(range(20)), 10, 10)
    assert tree.evict(lambda: True) == 10  # b, the least recently used leaf
    found = tree.match_tiers(list(range(20)), 20)
    assert (found.device, found.host) == (10, 10)
    assert tree.evict(lambda: False) == 10  # a, then nothing on the device
    assert tree.evictable_size == 0 and freed == [10, 10]


def first_prefills(result: dict) -> list[str]:
    order: list[str] = []
    for t in result["trace"]:
        order += [r for r, _, _ in t["extend"] if r not in order]
    return order


@pytest.mark.parametrize(
    "policy, order",
    [
        ("fcfs", ["a", "b", "c"]),
        ("hrrn", ["a", "c", "b"]),
        ("shortest-prefill-first", ["c", "b", "a"]),
    ],
)
def test_the_cache_aware_orders_differ_on_one_queue(policy, order):
    # a (300 tokens), b (200), c (100) arrive together, one runs at a time: fcfs keeps the
    # arrival order; hrrn's first pass has every ratio 0 and goes by rid (a), then the shorter
    # of the two that waited alike (c); shortest-prefill-first takes the least work first
    # (the real loop orders them so)
    res = run(
        kv_size=16384, max_running_requests=1, schedule_policy=policy,
        requests=[{"rid": rid, "len": n, "max_new_tokens": 3}
                  for rid, n in (("a", 300), ("b", 200), ("c", 100))],
    )  # fmt: skip
    assert first_prefills(res) == order


@pytest.mark.parametrize("policy", ["fcfs", "shortest-prefill-first"])
def test_shortest_prefill_first_cuts_the_chunk_to_let_a_short_prompt_in(policy):
    # chunks of 256: a 1000-token prompt starts; a 50-token one arrives during its first
    # chunk. fcfs gives the long prompt its whole chunk again and the short one waits;
    # shortest-prefill-first reserves the short one's 50 tokens of the next chunk (256 - 50;
    # the real loop does the same)
    res = run(
        kv_size=16384, chunked_prefill_size=256, overlap=False, schedule_policy=policy,
        requests=[
            {"rid": "long", "len": 1000, "max_new_tokens": 2},
            {"rid": "short", "len": 50, "arrival_ms": 1, "max_new_tokens": 2},
        ],
    )  # fmt: skip
    second = [tuple(row) for row in res["trace"][1]["extend"]]
    if policy == "fcfs":
        assert second == [("long", 256, 256)]
    else:
        assert second == [("long", 256, 206), ("short", 0, 50)]


def test_the_random_order_is_the_seeds():
    # SGLang shuffles with the process-wide generator; the model with its own, seeded: one
    # seed gives one order every time, and the seeds give different orders (one at a time,
    # eight requests arriving together: their first prefills are the order)
    def order(seed: int) -> list[str]:
        res = run(
            kv_size=16384, max_running_requests=1, schedule_policy="random", seed=seed,
            requests=[{"rid": f"q{i}", "len": 50, "max_new_tokens": 2} for i in range(8)],
        )  # fmt: skip
        assert all(st["output_len"] == 2 for st in res["requests"].values())
        return first_prefills(res)

    assert order(3) == order(3)
    orders = {tuple(order(seed)) for seed in range(6)}
    assert len(orders) > 1
    assert all(sorted(o) == [f"q{i}" for i in range(8)] for o in orders)


def test_shortest_prefill_first_without_the_radix_cache_is_refused_at_both_doors():
    """SGLang refuses ``shortest-prefill-first`` with the radix cache off: the loop's config
    and ``cpkv admit``'s config say so alike (one rule)."""
    from cpkv.core.config import load_config
    from cpkv.core.errors import ConfigError
    from cpkv.sglang.scenario import scenario_config

    spf = {"schedule_policy": "shortest-prefill-first", "requests": []}
    scenario_config({**spf, "disable_radix_cache": False})  # (with the cache: runs)
    with pytest.raises(ValueError, match="needs the radix cache"):
        scenario_config({**spf, "disable_radix_cache": True})
    overrides = [
        "admit.mode=serving",
        "admit.engine=sglang",
        "admit.schedule_policy=shortest-prefill-first",
    ]
    load_config("admit", None, overrides)
    with pytest.raises(ConfigError, match="schedule_policy: shortest-prefill-first needs"):
        load_config("admit", None, [*overrides, "admit.sglang.disable_radix_cache=true"])
