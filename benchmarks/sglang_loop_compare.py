"""cpkv's serving loops beside the real SGLang 0.5.23 scheduler loop, iteration by iteration.

Random scenarios (a queue larger than one batch, long prompts that chunk beside decodes,
bursts and gaps, pools small enough that decode retracts) run through both:

* the real loop: ``../shared/oracle/sglang_loop/drive.py`` (``Scheduler.event_loop_normal``
  with a fake one-token forward and the linear cost ``fixed + prefill_token x extend tokens +
  decode_req x decode rows``), radix cache off, page 1;
* cpkv's own loop (``admit.engine: cpkv``): ``admit.mode: serving``, ``policy:
  prefill_adder``, the same linear cost, a pool of ``kv_size`` one-token blocks, the same
  budgets and ratio;
* SGLang's loop as cpkv models it (``admit.engine: sglang``, :mod:`cpkv.sglang`) on the
  same scenario.

Each iteration is compared on its kind (prefill / mixed / decode), its extend rows
(``rid[prefix+extend]``), its number of decode rows and the requests retracted; each request
on the iterations of its first token and its finish. It prints, per setting, how many
scenarios agree on every field and, for the others, the first iteration where they part.

Run it in the oracle venv (``bash scripts/oracle_venv.sh``; importing sglang takes about a
minute)::

    .oracle-venv/bin/python benchmarks/sglang_loop_compare.py [--scenarios 100] [--seed 0]
        [--mixed-chunk both|on|off] [--show 3]

It measures how far each of cpkv's loops is from SGLang's; exit 0 either way.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT.parent / "shared" / "oracle" / "sglang_loop"


def scenario(rng: random.Random, mixed: bool) -> dict:
    """One random scenario in the driver's format (its SCENARIO_DOC)."""
    kv = rng.choice((1200, 2500, 6000, 20000, 65536))
    chunk = rng.choice((None, 256, 512, 1024, 2048))
    requests, t = [], 0.0
    for i in range(rng.randint(2, 24)):
        t += rng.choice((0.0, 0.0, rng.uniform(0, 5), rng.uniform(5, 80)))
        requests.append({
            "rid": f"r{i}", "arrival_ms": round(t, 3), "len": rng.randint(8, min(3000, kv // 2)),
            "max_new_tokens": rng.randint(1, 200),
        })  # fmt: skip
    return {
        "kv_size": kv, "page_size": 1, "max_running_requests": rng.choice((8, 64)),
        "chunked_prefill_size": chunk, "max_prefill_tokens": rng.choice((2048, 4096, 16384)),
        "enable_mixed_chunk": mixed, "overlap": False, "schedule_policy": "fcfs",
        "schedule_conservativeness": rng.choice((1.0, 1.0, 0.3)), "disable_radix_cache": True,
        "cost": {"fixed_us": 1000.0, "prefill_token_us": 20.0, "decode_req_us": 50.0},
        "requests": requests, "max_iterations": 20000,
    }  # fmt: skip


def oracle_trace(result: dict, sc: dict) -> tuple[list[tuple], dict[str, tuple]]:
    """The driver's result as comparable iterations and per-request (first, finish) iterations."""
    cost = sc["cost"]
    rows, ends = [], {}
    for it in result["trace"]:
        extend = tuple((r, p, e) for r, p, e in it["extend"])
        rows.append((it["kind"], extend, len(it["decode"]), len(it["retracted"])))
        tokens = sum(e for _, _, e in extend)
        duration = cost["fixed_us"] + cost["prefill_token_us"] * tokens
        duration += cost["decode_req_us"] * len(it["decode"])
        ends[round(it["t_ms"] * 1000 + duration)] = len(rows)
    marks = {}
    for rid, st in result["requests"].items():
        first = ends.get(round(st.get("first_token_us", -1)))
        finish = ends.get(round(st.get("finish_us", -1)))
        marks[rid] = (first, finish)
    return rows, marks


def cpkv_trace(sc: dict, folder: Path) -> tuple[list[tuple], dict[str, tuple]]:
    """cpkv's engine on the scenario, every iteration in full, as comparable iterations."""
    from cpkv.core.config import load_config
    from cpkv.serving.engine import engine as E
    from cpkv.serving.engine.settings import settings_from
    from cpkv.serving.engine.simulate import simulate
    from cpkv.serving.input.workload import load_serving_workload

    path = folder / "requests.jsonl"
    path.write_text("".join(
        json.dumps({"rid": r["rid"], "arrival_ms": r["arrival_ms"], "extend_tokens": r["len"],
                        "max_new_tokens": r["max_new_tokens"]}) + "\n"
        for r in sc["requests"]
    ))  # fmt: skip
    cost = sc["cost"]
    overrides = [
        "admit.mode=serving", "admit.policy=prefill_adder", "admit.workload.source=jsonl",
        f"admit.workload.path={path}", "admit.kv.block_size=1",
        f"admit.kv.capacity_blocks={sc['kv_size']}",
        f"admit.chunked_prefill_size={sc['chunked_prefill_size'] or 'null'}",
        f"admit.max_prefill_tokens={sc['max_prefill_tokens']}",
        f"admit.max_running_requests={sc['max_running_requests']}",
        f"admit.new_token_ratio={0.7 * sc['schedule_conservativeness']}",
        "admit.cost.kind=linear", f"admit.cost.fixed_us={cost['fixed_us']}",
        f"admit.cost.prefill_token_us={cost['prefill_token_us']}",
        f"admit.cost.decode_request_us={cost['decode_req_us']}", "admit.cost.context_token_us=0",
        "admit.cost.l2_load_gb_per_s=null", "admit.serving.stall_iterations=20000",
    ]  # fmt: skip
    block = load_config("admit", None, overrides).experiment.admit
    settings = settings_from(block, block.cost.build())
    requests = load_serving_workload(block.workload, block.max_new_tokens).requests
    rows, ends, current = [], {}, {}
    apply, iteration = E.Engine._apply, E.Engine._iteration

    def recorded_apply(self, plan):  # noqa: ANN001, ANN202
        out = apply(self, plan)
        current["extend"] = tuple(
            (p.request.rid, p.request.filled_tokens - p.tokens, p.tokens) for p in plan.prefills
        )
        return out

    def recorded_iteration(self):  # noqa: ANN001, ANN202
        current.clear()
        running = self.pool.n_running
        before = sum(self.counters["preemptions"].values())
        iteration(self)
        extend = current.get("extend", ())
        kind = "mixed" if running and extend else "prefill" if extend else "decode"
        rows.append((kind, extend, running, sum(self.counters["preemptions"].values()) - before))
        ends[round(self.now)] = len(rows)

    E.Engine._apply, E.Engine._iteration = recorded_apply, recorded_iteration
    try:
        result = simulate(requests, settings, events=True)
    finally:
        E.Engine._apply, E.Engine._iteration = apply, iteration
    marks = {
        r.rid: (ends.get(round(r.first_token_us or -1)), ends.get(round(r.finished_us or -1)))
        for r in result.requests
    }
    return rows, marks


def first_difference(a: list[tuple], b: list[tuple]) -> int | None:
    """The first iteration (1-based) where the two differ (kind, extend rows, decode rows,
    requests retracted), or None."""
    for k, (x, y) in enumerate(zip(a, b, strict=False), 1):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b)) + 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixed-chunk", choices=("both", "on", "off"), default="both")
    parser.add_argument("--show", type=int, default=3, help="differing scenarios shown each")
    args = parser.parse_args()
    sys.path.insert(0, str(DRIVER))
    started = time.perf_counter()
    import drive  # the real sglang loop (imports sglang: about a minute)

    print(f"sglang imported in {time.perf_counter() - started:.0f} s")
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.mixed_chunk]
    from cpkv.sglang import run_scenario

    for mixed in modes:
        rng = random.Random(args.seed)
        same, where, shown, modelled = 0, Counter(), 0, 0
        for n in range(args.scenarios):
            sc = scenario(rng, mixed)
            real_rows, real_marks = oracle_trace(drive.run_scenario(sc), sc)
            model_rows, model_marks = oracle_trace(run_scenario(sc), sc)
            modelled += model_rows == real_rows and model_marks == real_marks
            with tempfile.TemporaryDirectory() as tmp:
                our_rows, our_marks = cpkv_trace(sc, Path(tmp))
            k = first_difference(real_rows, our_rows)
            if k is None and real_marks == our_marks:
                same += 1
                continue
            kind = "marks" if k is None else (real_rows + [("end",)])[k - 1][0]
            where[kind] += 1
            if shown < args.show:
                shown += 1
                at = k or 1
                print(f"  scenario {n} (mixed chunk {'on' if mixed else 'off'}): first difference "
                      f"at iteration {at} of {len(real_rows)} (sglang) / {len(our_rows)} (cpkv)")  # fmt: skip
                for name, rows in (("sglang", real_rows), ("cpkv  ", our_rows)):
                    for row in rows[max(0, at - 2) : at + 1]:
                        print(
                            f"    {name} {row[0]:<7} extend={list(row[1])} decode={row[2]} "
                            f"retracted={row[3]}"
                        )
        print(f"mixed chunk {'on ' if mixed else 'off'}: engine cpkv (cpkv's loop) {same} of "
              f"{args.scenarios} scenarios identical on every iteration and every request's "
              f"first-token and finish iteration (the others first differ in a {dict(where)} "
              f"iteration); engine sglang {modelled} of {args.scenarios}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
