"""Token ids as runs: the same sequence as the ids one by one, and the same decisions."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.serving.engine import sglang_engine
from cpkv.sglang.radix import RadixTree
from cpkv.sglang.tokens import TokenRuns, shared_prefix
from tests.serving.sglang_loop.test_engine import req, serve

# runs drawn from a few starting ids so that runs touch, repeat and merge
runs_strategy = st.lists(
    st.tuples(st.sampled_from([0, 3, 5, 8, 100, -7]), st.integers(0, 6)), max_size=6
)


def flat(runs) -> list[int]:
    return [first + k for first, length in runs for k in range(length)]


@settings(max_examples=300, deadline=None)
@given(runs_strategy, st.integers(-3, 40), st.integers(-3, 40))
def test_runs_read_as_the_ids_one_by_one(runs, start, stop) -> None:
    ids, held = flat(runs), TokenRuns.of(runs)
    assert len(held) == len(ids) and list(held) == ids
    assert held == ids and held == TokenRuns.of((i, 1) for i in ids)  # canonical
    assert list(held[start:stop]) == ids[start:stop] and held[start:stop] == ids[start:stop]
    for i in range(-len(ids), len(ids)):
        assert held[i] == ids[i]
    with pytest.raises(IndexError):
        held[len(ids)]


@settings(max_examples=300, deadline=None)
@given(runs_strategy, runs_strategy, st.integers(0, 12), st.integers(0, 30))
def test_the_shared_prefix_is_counted_position_by_position(a, b, at, n) -> None:
    key, tokens = flat(a), flat(b)
    n = min(n, len(key), max(0, len(tokens) - at))
    naive = 0
    while naive < n and key[naive] == tokens[at + naive]:
        naive += 1
    assert shared_prefix(TokenRuns.of(a), TokenRuns.of(b), at, n) == naive
    assert shared_prefix(TokenRuns.of(a), tokens, at, n) == naive


@given(runs_strategy, st.integers(-5, 5), st.integers(0, 5))
def test_outputs_continue_the_runs(runs, first, count) -> None:
    assert list(TokenRuns.of(runs).then(first, count)) == flat(runs) + list(
        range(first, first + count)
    )


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("seed", range(10))
def test_the_radix_cache_does_the_same_with_runs_and_with_lists(page, seed) -> None:
    rng = random.Random(seed)
    trees = {kind: RadixTree(page, False, lambda n: None) for kind in ("runs", "list")}
    for _ in range(60):
        runs = [
            (rng.choice((0, 32, 64, 96)) * 7, rng.randint(1, 40)) for _ in range(rng.randint(1, 4))
        ]
        seq = {"runs": TokenRuns.of(runs), "list": flat(runs)}
        op = rng.random()
        seen = {}
        for kind, tree in trees.items():
            if op < 0.4:
                dup, length, _ = tree.insert(seq[kind], 0)
                seen[kind] = (dup, length)
            elif op < 0.8:
                found = tree.match_tiers(seq[kind], len(seq[kind]))
                seen[kind] = (found.device, found.host)
            else:
                seen[kind] = tree.evict(lambda: False)
            seen[kind] = (seen[kind], tree.evictable_size, tree.protected_size)
        assert seen["runs"] == seen["list"]


def trace_workload(seed: int) -> list:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(rng.randint(5, 30)):
        t += rng.choice((0.0, rng.uniform(0, 20), rng.uniform(20, 300)))
        prompt = rng.randint(10, 600)
        hashes = tuple(rng.randint(1, 5) for _ in range(prompt // 32 + 1))
        out.append(req(i, prompt, rng.randint(1, 300), at_ms=t, hashes=hashes))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_trace_prompts_as_runs_decide_as_prompts_as_lists(seed, monkeypatch) -> None:
    knobs = {"max_total_num_tokens": random.Random(seed).choice((3000, 8000)),
             "chunked_prefill_size": 256, "overlap": seed % 2 == 0}  # fmt: skip
    as_runs = serve(trace_workload(seed), trace_block=32, **knobs)
    runs_prompt = sglang_engine.prompt_tokens
    monkeypatch.setattr(sglang_engine, "prompt_tokens", lambda r, b: list(runs_prompt(r, b)))
    as_lists = serve(trace_workload(seed), trace_block=32, **knobs)
    assert [
        (r.l1_hit, r.prefilled, r.preemptions, r.first_token_us, r.finished_us) for r in as_runs
    ] == [(r.l1_hit, r.prefilled, r.preemptions, r.first_token_us, r.finished_us) for r in as_lists]
    assert any(r.l1_hit for r in as_runs)  # the prompts did share blocks
