"""The serving loop's PrefillAdder pass against cpkv's tick model (PrefillAdderModel), pass for
pass, on random queues: the serving pass restates the same sglang 0.5.23 arithmetic for a
pool without evictable cache, which is the tick model with no L1 hits and no evictable
tokens. Also the mixed-chunk budgets by hand, and one candidate against its budgets written out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.admission.adder import PrefillAdderModel
from cpkv.admission.budgets import AdmitBudgets, CpBudgets
from cpkv.serving.schedulers.adder_pass import AdderBudgets, Candidate, adder_pass
from cpkv.workload.request import Request, RunningDecode

CLIP = 4096


@st.composite
def scenarios(draw):
    page = draw(st.sampled_from([1, 4, 16]))
    reqs = draw(
        st.lists(
            st.tuples(
                st.integers(0, 1000),
                st.integers(1, 1500),
                st.one_of(st.integers(0, 300), st.integers(0, 5000)),
            ),
            min_size=1,
            max_size=8,
        )
    )
    running = draw(
        st.lists(
            st.tuples(
                st.one_of(st.integers(0, 300), st.integers(0, 5000)), st.integers(0, 200)
            ).map(lambda t: RunningDecode(t[0] + t[1], t[1])),
            max_size=4,
        )
    )
    cp_limits = draw(
        st.tuples(
            st.one_of(st.none(), st.integers(1, 4)),
            st.one_of(st.none(), st.integers(64, 3000)),
            st.one_of(st.none(), st.integers(64, 3000)),
        )
    )
    budgets = AdmitBudgets(
        available_tokens=draw(st.integers(0, 30000)),
        max_prefill_tokens=draw(st.integers(16, 4096)),
        chunked_prefill_size=draw(st.one_of(st.none(), st.integers(16, 2048))),
        page_size=page,
        new_token_ratio=draw(st.sampled_from([0.0, 0.098, 0.35, 0.7, 1.0])),
        max_running_requests=draw(st.one_of(st.none(), st.integers(len(running) + 1, 12))),
        prefill_max_requests=draw(st.one_of(st.none(), st.integers(1, 6))),
        load_back_threshold=draw(st.integers(0, 64)),
        running=tuple(running),
        cp=CpBudgets(True, cp_limits[1], cp_limits[2], cp_limits[0]),
    )
    requests = [Request(f"r{k}", 0, l2, e, mx) for k, (l2, e, mx) in enumerate(reqs)]
    return budgets, requests


def serving_budgets(b: AdmitBudgets) -> AdderBudgets:
    cp = b.cp
    return AdderBudgets(
        b.page_size,
        b.max_prefill_tokens,
        b.chunk_tokens,
        b.max_running_requests,
        b.prefill_max_requests,
        b.load_back_threshold,
        cp.max_batch_requests,
        cp.max_total_extend_tokens,
        cp.max_total_cached_tokens,
    )


def candidates(requests, page):
    for r in requests:
        h = r.l2_cached_tokens // page * page
        yield Candidate(
            r.fill_tokens, 0, h, min(r.max_new_tokens, CLIP), min(r.max_new_tokens, CLIP)
        )


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_two_passes_agree_with_the_tick_model(scenario) -> None:
    budgets, requests = scenario
    model = PrefillAdderModel(requests, budgets)
    b = serving_budgets(budgets)
    headroom = budgets.running_offset()
    avail = budgets.allocator_tokens()
    queue = list(requests)
    chunk = None
    for tick in range(2):
        record = model.run_pass(tick)
        got = adder_pass(
            avail, 0, headroom, len(budgets.running), b, chunk, candidates(queue, budgets.page_size)
        )
        accepted = list(record.accepted)
        if chunk is not None:
            cont = accepted.pop(0) if accepted and accepted[0].continuation else None
            assert got.chunk_tokens == (cont.extend_tokens if cont else 0)
            assert got.chunk_done == (cont is not None and not cont.chunked)
        want = [(a.extend_tokens, a.loaded_tokens, a.chunked) for a in accepted]
        assert got.admitted == want
        assert got.stop == record.stopped_budget
        # the next pass: what the model left, the request it cut, the rest of the queue
        admitted = queue[: len(want)]
        queue = queue[len(want) :]
        avail = record.allocator_available_after_tick
        cut = [(r, a) for r, a in zip(admitted, accepted, strict=True) if a.chunked]
        if cut:
            r, a = cut[0]
            done = a.prefix_tokens + a.extend_tokens
            chunk = (r.fill_tokens - done, min(r.max_new_tokens, CLIP), done)
        elif chunk is not None and got.chunk_done:
            chunk = None
        elif chunk is not None:
            left, mx, done = chunk
            chunk = (left - got.chunk_tokens, mx, done + got.chunk_tokens)


def test_mixed_decode_tokens_come_off_every_budget() -> None:
    b = AdderBudgets(page=1, max_prefill_tokens=100, chunk_tokens=60)
    # 10 running decodes: chunk budget 50, memory 1000 - 10 - headroom 40
    q = [Candidate(200, 0, 0, 20, 20)]
    got = adder_pass(1000, 10, 40.0, 10, b, None, iter(q))
    assert got.admitted == [(50, 0, True)] and got.stop == "rem_chunk_tokens"
    # the memory check: 200 + 20 + 1 < 1000 - 10 - 40 holds; with 270 free it does not
    assert adder_pass(270, 10, 40.0, 10, b, None, iter(q)).stop == "rem_total_tokens"
    # decodes that fill the chunk budget leave no prefill at all
    got = adder_pass(1000, 60, 0.0, 60, b, (30, 5, 100), iter(q))
    assert got.chunk_tokens == 0 and got.admitted == [] and got.stop == "rem_chunk_tokens"


@st.composite
def lone_passes(draw):
    page = draw(st.sampled_from([1, 4, 16]))
    budgets = AdderBudgets(
        page,
        draw(st.integers(1, 4096)),
        draw(st.one_of(st.none(), st.integers(1, 2048))),
        draw(st.one_of(st.none(), st.integers(0, 8))),
        draw(st.one_of(st.none(), st.integers(0, 3))),
        draw(st.integers(0, 64)),
        *draw(st.sampled_from([(None, None, None), (2, 64, 128), (1, 16, 16)])),
    )
    fill = draw(st.integers(1, 3000))
    device = draw(st.integers(0, fill - 1)) // page * page
    host = draw(st.integers(0, fill - 1 - device)) // page * page
    asked = draw(st.integers(0, CLIP))
    left = draw(st.integers(0, asked))
    running = draw(st.integers(0, 10))
    mixed = draw(st.sampled_from([0, running]))
    free = draw(st.integers(0, 40000))
    headroom = draw(st.sampled_from([0.0, 0.5, 123.25, 5000.0]))
    return free, mixed, headroom, running, budgets, (fill, device, host, left, asked)


@settings(max_examples=2000, deadline=None)
@given(lone_passes())
def test_a_lone_candidate_admitted_whole(case) -> None:
    """A queue of one candidate and no chunked request: the pass admits it whole exactly when
    every budget allows it, with the extend, load-back and stop reason written out here
    (SGLang's checks before the admission, then ``budget_state()`` after it)."""
    free, mixed, headroom, running, b, candidate = case
    fill, device, host, left, asked = candidate
    got = adder_pass(free, mixed, headroom, running, b, None, iter([candidate]))
    assert got.chunk_tokens == 0 and not got.chunk_done
    loaded = 0 if 0 < host < max(1, b.load_back_threshold) else host  # a declined hit
    extend = fill - device - loaded
    paged = -(-extend // b.page) * b.page
    rem_input = b.max_prefill_tokens - mixed
    rem_chunk = None if b.chunk_tokens is None else b.chunk_tokens - mixed
    top = free - mixed - headroom > 0 and free - mixed > 0  # budget_state() at the top
    whole = (
        not (top and (rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0)))
        and (b.max_running_requests is None or b.max_running_requests - running > 0)
        and (b.prefill_max_requests is None or b.prefill_max_requests > 0)
        and fill - device + left + b.page < free - mixed - headroom
        and (rem_chunk is None or paged <= rem_chunk)
    )
    if not whole:
        assert got.admitted == [] or got.admitted[0][2]  # stopped, or cut into a chunk
        return
    room = free - loaded
    if room - (mixed + headroom + paged + b.page + asked) <= 0:  # budget_state() after it
        stop = "rem_total_tokens"
    elif room - (mixed + paged + b.page) <= 0:
        stop = "cur_rem_tokens"
    elif rem_input - paged <= 0:
        stop = "rem_input_tokens"
    elif rem_chunk is not None and rem_chunk - paged <= 0:
        stop = "rem_chunk_tokens"
    else:
        stop = None
    assert got.admitted == [(extend, loaded, False)] and got.stop == stop
