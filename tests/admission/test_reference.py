"""The model against a slow, literal reference written here from the semantics (no sglang needed).

``Reference`` follows shared/reference/sglang_admission_semantics.md sections 4-8 line by line
(add_chunked_req, the scan loop, add_one_req with select / load-back / commit, budget_state)
plus cpkv's documented rules (CP limits after the selection and before the load-back, the tick
conventions, LRU eviction order). It recomputes everything from scratch at each use: the
evictable cache by summing over the waiting queue, the eviction order by listing every node.
Hypothesis drives seeded random scenarios, with and without CP limits and load-back quotas.
"""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from cpkv.admission.scenarios import random_scenario
from cpkv.admission.ticks import run_admission
from cpkv.core.schema import to_dict
from cpkv.workload.request import Request

CLIP = 4096


def ceil_p(x, p):
    return (x + p - 1) // p * p


class Reference:
    def __init__(self, requests, b):
        self.b, self.p = b, b.page_size
        p = self.p
        self.req = {r.rid: r for r in requests}
        self.queue = [r.rid for r in requests]
        self.dev = {r.rid: r.l1_cached_tokens // p * p for r in requests}
        self.host = {
            r.rid: (r.l1_cached_tokens + r.l2_cached_tokens) // p * p - self.dev[r.rid]
            for r in requests
        }
        self.orig = {rid: (self.dev[rid], self.host[rid]) for rid in self.queue}
        self.free = b.available_tokens // p * p
        self.other = b.evictable_tokens // p * p
        self.released = []  # [stamp, [node tokens, leaf first]]
        self.held = {}  # admitted rid -> (stamp, device prefix at admission, loaded)
        self.chunk = None  # [rid, tokens computed so far]
        self.clock = 0

    def max_new(self, rid):
        m = self.req[rid].max_new_tokens
        return min(self.b.max_new_tokens if m is None else m, CLIP)

    def evictable(self, locked=None):
        waiting = sum(self.dev[r] for r in self.queue if r != locked)
        return self.other + waiting + sum(sum(nodes) for _, nodes in self.released)

    def evict_until(self, target, locked):
        """LRU: the other cache, the waiting prefixes behind the candidate, released nodes."""
        order = ["other"] if self.other else []
        behind = self.queue[self.queue.index(locked) + 1 :]
        order += [r for r in behind if self.dev[r]]
        order += [
            ("rel", k) for k in sorted(range(len(self.released)), key=lambda k: self.released[k][0])
        ]
        freed = 0
        for node in order:
            if self.free >= target:
                break
            if node == "other":
                got, self.other = self.other, 0
                self.free += got
            elif isinstance(node, str):
                got = self.dev[node]
                self.host[node] += got
                self.dev[node] = 0
                self.free += got
            else:
                got = 0
                nodes = self.released[node[1]][1]
                while nodes and self.free < target:
                    size = nodes.pop(0)
                    self.free += size
                    got += size
            freed += got
        self.released = [x for x in self.released if x[1]]
        return freed

    def run(self):
        ticks = []
        while self.queue or self.chunk:
            t = self.tick(len(ticks))
            ticks.append(t)
            if not t["accepted"]:
                break
            if self.b.release_each_tick:
                for rid in t["_finished"]:
                    stamp, d, loaded = self.held.pop(rid)
                    d0, h0 = self.orig[rid]
                    nodes = (
                        [loaded, d] if d else ([h0, d0] if loaded == d0 + h0 and d0 else [loaded])
                    )
                    nodes = [x for x in nodes if x]
                    if nodes:
                        self.released.append([stamp, nodes])
            del t["_finished"]
        return ticks

    def tick(self, k):
        b, p = self.b, self.p
        st = {"total_off": sum([min(r.max_new_tokens - r.output_len, CLIP) * (1.0 if r.ignore_eos else float(b.new_token_ratio)) for r in b.running]),
                  "cur_off": 0, "rem_input": b.max_prefill_tokens, "rem_chunk": b.chunk_tokens}  # fmt: skip
        acc, events, finished, decisions = [], [], [], 0
        cp_ext = cp_cached = 0

        def rem_total(locked=None):
            return self.free + self.evictable(locked) - st["total_off"]

        def reserve(e, maxnew):
            ep = ceil_p(e, p)
            st["total_off"] += ep + p + maxnew
            st["cur_off"] += ep + p
            st["rem_input"] -= ep
            if st["rem_chunk"] is not None:
                st["rem_chunk"] -= ep

        def state():
            if rem_total() <= 0 or self.free + self.evictable() - st["cur_off"] <= 0:
                return "NO_TOKEN"
            if st["rem_input"] <= 0 or (st["rem_chunk"] is not None and st["rem_chunk"] <= 0):
                return "OTHER"
            return "CONTINUE"

        if self.chunk:  # add_chunked_req
            decisions += 1
            rid, done = self.chunk
            lim = min(st["rem_chunk"], int(rem_total()))
            if lim <= 0:
                lim = st["rem_chunk"]
            left = self.req[rid].fill_tokens - done
            n = min(left, lim)
            reserve(n, 0 if left > lim else self.max_new(rid))
            acc.append({"rid": rid, "prefix_tokens": done, "extend_tokens": n, "chunked": left > lim, "continuation": True,
                            "host_hit_tokens": 0, "loaded_tokens": 0})  # fmt: skip
            cp_ext, cp_cached = ceil_p(n, p), ceil_p(done, p)
            if left > lim:
                self.chunk = [rid, done + n]
            else:
                self.chunk = None
                finished.append(rid)

        def cp_stop(pre, ext):
            cp = b.cp
            if not (cp.enabled and acc):
                return None
            if cp.max_batch_requests is not None and len(acc) + 1 > cp.max_batch_requests:
                return "cp_max_batch_requests"
            if (
                cp.max_total_extend_tokens is not None
                and cp_ext + ceil_p(ext, p) > cp.max_total_extend_tokens
            ):
                return "cp_max_total_extend_tokens"
            if (
                cp.max_total_cached_tokens is not None
                and cp_cached + ceil_p(pre, p) > cp.max_total_cached_tokens
            ):
                return "cp_max_total_cached_tokens"
            return None

        def select(rid, h, total):
            pre = self.dev[rid] + h
            ext = self.req[rid].fill_tokens - pre
            if not total < rem_total(locked=rid):
                return "NO_TOKEN", "rem_total_tokens"
            if st["rem_chunk"] is None:
                if acc and ceil_p(ext, p) >= st["rem_input"]:
                    return "OTHER", "rem_input_tokens"
                return pre, ext, False
            if ceil_p(ext, p) > st["rem_chunk"]:
                ext = (pre + st["rem_chunk"] // p * p) // p * p - pre
                if ext <= 0:
                    return "OTHER", "rem_chunk_tokens"
                return pre, ext, True
            return pre, ext, False

        stop = ("queue_exhausted", None, "queue_exhausted")
        for i, rid in enumerate(list(self.queue)):
            if i == 0 and state() == "OTHER":
                stop = (
                    "OTHER",
                    "rem_input_tokens" if st["rem_input"] <= 0 else "rem_chunk_tokens",
                    "scan_top",
                )
                break
            cap = b.max_running_requests
            if cap is not None and len(acc) >= cap - len(b.running):
                stop = ("batch_full", "max_running_requests", "batch_full")
                break
            decisions += 1
            self.clock += 1
            if b.prefill_max_requests is not None and len(acc) >= b.prefill_max_requests:
                stop = ("OTHER", "prefill_max_requests", "refused")
                break
            d, h, L = self.dev[rid], self.host[rid], self.req[rid].fill_tokens
            total = (L - d) + self.max_new(rid) + p
            sel = select(rid, h, total)
            if len(sel) == 3 and (name := cp_stop(sel[0], sel[1])):
                sel = ("OTHER", name)
            loaded = 0
            if len(sel) == 3 and h:
                before, freed = self.free, 0
                if h < max(1, b.load_back_threshold):
                    outcome = "below_threshold"
                elif b.load_back_quota_tokens is not None and h > b.load_back_quota_tokens:
                    outcome = "over_quota"
                else:
                    if self.free < h:
                        freed = self.evict_until(h, rid)
                    outcome = "loaded" if self.free >= h else "no_room"
                if outcome == "loaded":
                    self.free -= h
                    loaded = h
                events.append({"rid": rid, "requested_tokens": h, "paged_tokens": h, "loaded_tokens": loaded,
                                   "quota_tokens": b.load_back_quota_tokens, "available_before_tokens": before,
                                   "available_after_tokens": self.free, "evicted_tokens": freed, "outcome": outcome})  # fmt: skip
                if not loaded:
                    sel = select(rid, 0, total)
                    if len(sel) == 3 and (name := cp_stop(sel[0], sel[1])):
                        sel = ("OTHER", name)
            if len(sel) == 2:
                stop = (sel[0], sel[1], "refused")
                break
            pre, ext, cut = sel
            self.queue.remove(rid)  # admitted: its prefix is locked from now on
            self.held[rid] = (self.clock, d, loaded)
            reserve(ext, 0 if cut else self.max_new(rid))
            acc.append({"rid": rid, "prefix_tokens": pre, "extend_tokens": ext, "chunked": cut, "continuation": False,
                            "host_hit_tokens": h, "loaded_tokens": loaded})  # fmt: skip
            cp_ext += ceil_p(ext, p)
            cp_cached += ceil_p(pre, p)
            if cut:
                self.chunk = [rid, pre + ext]
            else:
                finished.append(rid)
            verdict = state()
            if verdict != "CONTINUE":
                if verdict == "NO_TOKEN":
                    name = "rem_total_tokens" if rem_total() <= 0 else "cur_rem_tokens"
                else:
                    name = "rem_input_tokens" if st["rem_input"] <= 0 else "rem_chunk_tokens"
                stop = (verdict, name, "after_admit")
                break
        return {
            "tick": k, "accepted": acc, "stopped_on_rid": self.queue[0] if self.queue else None,
            "stopped_result": stop[0], "stopped_budget": stop[1], "stopped_where": stop[2],
            "log_hit_tokens": sum(a["prefix_tokens"] for a in acc if not a["continuation"]),
            "log_input_tokens": sum(a["extend_tokens"] for a in acc),
            "cp_total_extend_tokens": cp_ext, "cp_total_cached_tokens": cp_cached, "cp_batch_requests": len(acc),
            "allocator_available_after_tick": self.free, "evictable_after_tick": self.evictable(),
            "load_back_events": events, "rem_total_tokens": rem_total(),
            "cur_rem_tokens": self.free + self.evictable() - st["cur_off"], "rem_input_tokens": st["rem_input"],
            "rem_chunk_tokens": st["rem_chunk"], "decisions": decisions, "_finished": finished,
        }  # fmt: skip


def model_ticks(requests, budgets):
    out = []
    for t in run_admission(requests, budgets).ticks:
        row = to_dict(t)
        del row["duration_us"]
        out.append(row)
    return out


def check(requests, budgets):
    ref = Reference(requests, budgets).run()
    got = model_ticks(requests, budgets)
    for k, (m, r) in enumerate(zip(got, ref, strict=False)):
        diff = {key: (m[key], r[key]) for key in m if json.dumps(m[key]) != json.dumps(r[key])}
        assert not diff, f"tick {k} differs (model, reference): {diff}"
    assert len(got) == len(ref)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31), cp=st.booleans(), quota=st.sampled_from([None, None, 64, 1024]))
def test_model_matches_the_reference(seed, cp, quota):
    sc = random_scenario(seed, cp=cp)
    check(sc.requests, dataclasses.replace(sc.budgets, load_back_quota_tokens=quota))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_model_matches_the_reference_on_larger_queues(seed):
    sc = random_scenario(seed, cp=True, max_requests=60)
    check(sc.requests, sc.budgets)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**31), cp=st.booleans())
def test_every_prompt_is_computed_exactly_once(seed, cp):
    """Invariants: a request is admitted at most once; its chunks tile [prefix, L) in order;
    a finished run leaves no request behind unless its last tick admitted nothing."""
    sc = random_scenario(seed, cp=cp)
    result = run_admission(sc.requests, sc.budgets)
    fill = {r.rid: r.fill_tokens for r in sc.requests}
    progress: dict[str, int] = {}
    for t in result.ticks:
        for a in t.accepted:
            if a.continuation:
                assert progress[a.rid] == a.prefix_tokens
            else:
                assert a.rid not in progress
            progress[a.rid] = a.prefix_tokens + a.extend_tokens
            assert a.extend_tokens >= 1 and progress[a.rid] <= fill[a.rid]
            assert (progress[a.rid] < fill[a.rid]) == a.chunked
    assert result.summary.requests_admitted == len(progress)
    if result.ticks[-1].accepted:
        assert all(progress.get(r.rid) == fill[r.rid] for r in sc.requests)


def test_reference_agrees_on_a_hand_case():
    # guards the reference itself: the seed grid's first tick (see test_admit_model)
    from cpkv.admission.budgets import AdmitBudgets
    from cpkv.workload.sources import WorkloadSpec, load_workload

    ref = Reference(load_workload(WorkloadSpec()), AdmitBudgets()).run()
    assert [a["rid"] for a in ref[0]["accepted"]][-1] == "g6_4096_4096_128"
    assert ref[0]["rem_total_tokens"] == 11808 - 7559 and Request("x").extend_tokens == 1
