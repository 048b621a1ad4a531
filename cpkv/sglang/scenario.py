"""Scenarios in the format of the SGLang loop oracle (``../shared/oracle/sglang_loop/drive.py``),
run through the model, with the oracle's per-iteration records.

A scenario gives the server's knobs (``page_size``, ``kv_size``, ``max_running_requests``,
``context_len``, ``chunked_prefill_size``, ``max_prefill_tokens``, ``enable_mixed_chunk``,
``overlap``, ``schedule_policy``, ``schedule_conservativeness``, ``disable_radix_cache``,
priority scheduling: ``enable_priority_scheduling``, ``schedule_low_priority_values_first``,
``priority_scheduling_preemption_threshold``, ``retraction_policy``; cpkv's host tier, which the
oracle does not have: ``hicache_tokens``, ``load_back_threshold``), a
linear cost (``fixed_us + prefill_token_us x extend tokens + decode_req_us x decode rows`` a
batch), prefixes put in the radix tree first (``cached``) and the requests (``rid``,
``arrival_ms``, a prompt as ``len`` fresh tokens, as ``ids`` or as ``prefix_of`` a cached
prefix, ``hit`` tokens of it then fresh ones; ``max_new_tokens``, ``ignore_eos``,
``priority``). Each record also lists the requests preempted for a higher priority since the
last one (``preempted``). Every
generated token is token 7, as the oracle's fake forward makes it.

The clock: each pass first adds the requests that have arrived; when the server is fully idle
it jumps to the next arrival. A batch starts at the clock and ends its cost later; its tokens
are stamped with its end.
"""

from __future__ import annotations

from array import array
from typing import Any

from cpkv.sglang.config import LoopConfig
from cpkv.sglang.listener import Listener
from cpkv.sglang.loop import DECODE, Batch, Loop
from cpkv.sglang.request import Req

SGLANG_VERSION = "0.5.23"
FRESH_TOKENS = 10_000_000  # the first token id the oracle gives a prompt's own tokens
OUTPUT_TOKEN = 7


def scenario_config(sc: dict) -> LoopConfig:
    """The scenario's knobs as a :class:`LoopConfig` (the oracle's defaults where absent)."""
    return LoopConfig(
        max_total_num_tokens=sc.get("kv_size", 4096),
        max_running_requests=sc.get("max_running_requests", 64),
        context_len=sc.get("context_len", 8192),
        chunked_prefill_size=sc.get("chunked_prefill_size"),
        max_prefill_tokens=sc.get("max_prefill_tokens", 16384),
        page_size=sc.get("page_size", 1),
        enable_mixed_chunk=bool(sc.get("enable_mixed_chunk", False)),
        overlap=bool(sc.get("overlap", False)),
        disable_radix_cache=bool(sc.get("disable_radix_cache", False)),
        schedule_policy=sc.get("schedule_policy", "fcfs"),
        seed=sc.get("seed", 0),
        schedule_conservativeness=sc.get("schedule_conservativeness", 1.0),
        enable_priority_scheduling=bool(sc.get("enable_priority_scheduling", False)),
        schedule_low_priority_values_first=bool(
            sc.get("schedule_low_priority_values_first", False)
        ),
        priority_scheduling_preemption_threshold=sc.get(
            "priority_scheduling_preemption_threshold", 10
        ),
        retraction_policy=sc.get("retraction_policy", "length"),
        hicache_tokens=sc.get("hicache_tokens"),
        load_back_threshold=sc.get("load_back_threshold", 10),
    )


class _Recorder(Listener):
    """The oracle's records: one per batch, the requests' first-token and finish times."""

    def __init__(self, loop: Loop, cost: tuple[float, float, float]) -> None:
        self.loop, self.cost = loop, cost
        self.now = 0.0
        self.trace: list[dict] = []
        self.stats: dict[str, dict] = {}
        self.retracted_since: list[str] = []
        self.preempted_since: list[str] = []
        self.reqs: list[Req] = []  # those with a token

    def launch(self, batch: Batch) -> None:
        loop = self.loop
        fixed, per_token, per_decode = self.cost
        if batch.mode == DECODE:
            decoding, kind = batch.reqs, "decode"
        else:
            decoding = batch.decoding or []
            kind = "mixed" if batch.decoding else "prefill"
        tokens = sum(row[2] for row in batch.rows)
        start = self.now
        self.now = batch.end_us = start + fixed + per_token * tokens + per_decode * len(decoding)
        pool, tree = loop.pool, loop.tree
        self.trace.append({
            "it": loop.forward_ct, "t_ms": round(start / 1000, 3), "kind": kind,
            "extend": [[r.rid, prefix, extend] for r, prefix, extend, _ in batch.rows],
            "decode": [r.rid for r in decoding],
            "chunked": loop.chunked_req.rid if loop.chunked_req is not None else None,
            "retracted": self.retracted_since, "preempted": self.preempted_since,
            "ratio": round(loop.ratio, 6),
            "avail": pool.available(), "evictable": tree.evictable_size,
            "protected": tree.protected_size, "waiting": len(loop.waiting),
            "running": len(loop.running.reqs),
        })  # fmt: skip
        self.retracted_since = []
        self.preempted_since = []

    def first_token(self, req: Req, batch: Batch) -> None:
        self.reqs.append(req)
        self.stats[req.rid].setdefault("first_token_us", batch.end_us)

    def last_tokens(self) -> None:
        for req in self.reqs:
            self.stats[req.rid]["last_token_us"] = req.last_token_us

    def finished(self, req: Req, batch: Batch) -> None:
        st = self.stats[req.rid]
        if "finish_us" not in st:
            st["finish_us"] = batch.end_us
            st["output_len"] = req.output_len

    def preempted(self, req: Req) -> None:
        self.preempted_since.append(req.rid)

    def retracted(self, req: Req, held_tokens: int) -> None:
        self.retracted_since.append(req.rid)
        st = self.stats[req.rid]
        st["retractions"] = st.get("retractions", 0) + 1


def _prompts(sc: dict, page: int) -> tuple[list[array], list[tuple[float, int, dict, array]]]:
    """The cached prefixes (page-aligned) and the requests' prompts, in arrival order."""
    fresh = FRESH_TOKENS
    cached = []
    for tokens in sc.get("cached", []):
        cached.append(array("q", tokens[: len(tokens) // page * page]))
    pending = []
    for i, spec in enumerate(sc["requests"]):
        if "ids" in spec:
            ids = array("q", spec["ids"])
        elif "prefix_of" in spec:
            base = cached[spec["prefix_of"]]
            k = min(spec.get("hit", len(base)), len(base))
            ids = base[:k] + array("q", range(fresh, fresh + spec["len"] - k))
            fresh += spec["len"] - k
        else:
            ids = array("q", range(fresh, fresh + spec["len"]))
            fresh += spec["len"]
        pending.append((spec.get("arrival_ms", 0.0) * 1000.0, i, spec, ids))
    pending.sort(key=lambda item: (item[0], item[1]))
    return cached, pending


def run_scenario(sc: dict) -> dict:
    """Run one scenario: ``{iterations, trace, requests, end_ms, final}`` as the oracle gives
    them (without its wall-clock fields)."""
    config = scenario_config(sc)
    cost = sc.get("cost", {})
    loop = Loop(config)
    rec = _Recorder(loop, (
        cost.get("fixed_us", 1000.0), cost.get("prefill_token_us", 20.0),
        cost.get("decode_req_us", 50.0),
    ))  # fmt: skip
    loop.listener = rec
    cached, pending = _prompts(sc, config.page_size)
    for tokens in cached:
        loop.pool.take_pages(len(tokens) // config.page_size)
        loop.tree.insert(tokens, 0)
    max_iterations = sc.get("max_iterations", 100000)
    at, done = 0, False
    while not done:  # (the pass that notices the end still runs, as the oracle's loop does)
        if loop.forward_ct >= max_iterations:
            done = True
        else:
            idle = loop.is_fully_idle()
            if idle and at < len(pending) and pending[at][0] > rec.now:
                rec.now = pending[at][0]
            got = False
            while at < len(pending) and pending[at][0] <= rec.now:
                t, i, spec, ids = pending[at]
                at += 1
                req = Req(spec.get("rid", f"r{i}"), i, ids, spec.get("max_new_tokens", 16),
                      bool(spec.get("ignore_eos", False)), t, spec.get("priority"),
                      output_token=OUTPUT_TOKEN)  # fmt: skip
                rec.stats[req.rid] = {"arrival_us": t, "input_len": len(ids)}
                loop.add_request(req)
                got = True
            done = not got and at >= len(pending) and idle
        loop.step()
    rec.last_tokens()
    pool, tree = loop.pool, loop.tree
    return {
        "iterations": len(rec.trace), "trace": rec.trace, "requests": rec.stats,
        "end_ms": round(rec.now / 1000, 3),
        "final": {
            "avail": pool.available(), "evictable": tree.evictable_size,
            "protected": tree.protected_size, "waiting": len(loop.waiting),
            "running": len(loop.running.reqs), "ratio": loop.ratio,
        },
    }  # fmt: skip


def run_scenarios(scenarios: list[dict]) -> list[dict]:
    return [run_scenario(sc) for sc in scenarios]


def describe(result: dict) -> Any:
    """The trace as the oracle prints it (``drive.py``'s ``fmt_trace``), one line a batch."""
    lines = []
    for t in result["trace"]:
        ext = " ".join(f"{r}[{p}+{e}]" for r, p, e in t["extend"])
        dec = f" dec={len(t['decode'])}" if t["decode"] else ""
        ch = f" chunk={t['chunked']}" if t["chunked"] else ""
        rt = f" RETRACT={t['retracted']}" if t["retracted"] else ""
        lines.append(
            f"  #{t['it']:<4} {t['t_ms']:>9.3f}ms {t['kind']:<7} {ext}{dec}{ch}{rt} "
            f"ratio={t['ratio']:.4f} avail={t['avail']} evict={t['evictable']} "
            f"prot={t['protected']} wait={t['waiting']} run={t['running']}"
        )
    return "\n".join(lines)
