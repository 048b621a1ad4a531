"""Serving runs under vLLM's scheduler (``admit.engine: vllm``): the decode-only stretches in
closed form against every step in full, side by side in one process, then whole runs.

Usage (from the repository root)::

    python benchmarks/vllm_serving_speed.py [--requests 10000] [--repeat 2]
                                            [--process 100000,1000000]

Engine side by side: the same requests through :class:`~cpkv.serving.engine.vllm_engine.
VllmEngine` with its fast path (``fast``) and with every step run in full, interleaved,
``--repeat`` times (the best of each), on the Mooncake config (``configs/admit/
serving_vllm.yaml``, when ``../shared`` is here) and on the synthetic workload W (prompt 1024,
output 256, Poisson 8 req/s, 16,384 x 16 blocks, vLLM's default budgets) at ``--requests``.
Each pair must make the same decisions (every request's preemptions, first-token and finish
times to a relative 1e-9, the step count): printed as ``same``. Then, for each count of
``--process``, one whole ``cpkv admit`` process of W (run directory, no plots): its wall time
and the peak resident memory of its process tree, against the targets (a million requests:
<= 15 s, <= 400 MB). The machine is shared: times move with its load (printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving_scale import admit  # noqa: E402

from cpkv.core.config import load_config  # noqa: E402
from cpkv.serving.cost.spec import CostSpec  # noqa: E402
from cpkv.serving.engine.simulate import KeepRequests  # noqa: E402
from cpkv.serving.engine.vllm_engine import VllmEngine, vllm_settings_from  # noqa: E402
from cpkv.serving.input.workload import load_serving_workload  # noqa: E402
from cpkv.serving.record.iteration_log import IterationLog  # noqa: E402

MOONCAKE = "configs/admit/serving_vllm.yaml"
W = [
    "admit.mode=serving", "admit.engine=vllm", "admit.workload.source=synthetic",
    "admit.workload.synthetic.extend_tokens.choices=[1024]",
    "admit.workload.synthetic.l1_cached_tokens.choices=[0]",
    "admit.workload.synthetic.l2_cached_tokens.choices=[0]",
    "admit.workload.synthetic.max_new_tokens.choices=[256]",
    "admit.arrivals.process=poisson", "admit.arrivals.rate_rps=8",
    "admit.kv.block_size=16", "admit.kv.capacity_blocks=16384",
    "admit.slo.ttft_ms=100", "admit.slo.tpot_ms=12",
]  # fmt: skip
TIME_S, RSS_MB = 15.0, 400.0


def one_run(cfg, fast: bool) -> tuple[float, list[tuple], int]:
    """The engine alone on the config's requests: (seconds, per request (rid, preemptions,
    first token, finish), steps)."""
    block = cfg.admit
    workload = load_serving_workload(block.workload, block.max_new_tokens, cfg.seed)
    settings = vllm_settings_from(block, block.cost.build(), workload)
    sink = KeepRequests()
    log = IterationLog(settings.capacity_blocks, settings.block_size, cost=settings.cost)
    engine = VllmEngine(
        settings, sink=sink, samples=log, arrivals=workload.arriving(block.arrivals, cfg.seed)
    )
    engine.fast = fast
    start = time.process_time()
    result = engine.run()
    seconds = time.process_time() - start
    log.discard()
    done = [(r.rid, r.preemptions, r.first_token_us, r.finished_us) for r in sink.requests]
    return seconds, sorted(done), result.iterations


def same(a: list[tuple], b: list[tuple]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x[:2] != y[:2]:
            return False
        for u, v in zip(x[2:], y[2:], strict=True):
            if (u is None) != (v is None) or (u is not None and abs(u - v) > 1e-9 * max(1, abs(u))):
                return False
    return True


def side_by_side(name: str, path: str | None, overrides: list[str], repeat: int) -> None:
    cfg = load_config("admit", path, overrides).experiment
    best = {True: float("inf"), False: float("inf")}
    outcome: dict[bool, tuple] = {}
    for _ in range(repeat):
        for fast in (False, True):
            seconds, done, steps = one_run(cfg, fast)
            best[fast] = min(best[fast], seconds)
            outcome[fast] = (done, steps)
    equal = same(outcome[True][0], outcome[False][0]) and outcome[True][1] == outcome[False][1]
    count = len(outcome[True][0])
    print(
        f"{name:24s} {count:9,d} {outcome[True][1]:11,d} {best[False]:9.2f}s {best[True]:8.2f}s "
        f"{best[False] / best[True]:7.1f}x  {best[True] / count * 1e6:7.1f}  "
        f"{'same' if equal else 'DIFFERENT'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--process", default="100000,1000000", help="counts; '' for none")
    args = parser.parse_args()
    os.chdir(ROOT)
    CostSpec()  # (import the cost models before timing)
    print(f"load average {os.getloadavg()[0]:.2f}; process CPU seconds, engine only")
    print(
        f"{'workload':24s} {'requests':>9s} {'steps':>11s} {'every step':>10s} {'fast':>9s} "
        f"{'ratio':>8s}  {'us/req':>7s}  decisions"
    )
    if (ROOT.parent / "shared" / "data").is_dir():
        side_by_side("mooncake (serving_vllm)", MOONCAKE, [], args.repeat)
    w = [*W, f"admit.workload.synthetic.count={args.requests}"]
    side_by_side(f"W8 {args.requests:,}", None, w, args.repeat)
    for count in [int(c) for c in args.process.split(",") if c]:
        wall, peak = admit(ROOT, [*W, f"admit.workload.synthetic.count={count}"], False)
        mb = peak * 1024 / 1e6
        met = "met" if count < 1_000_000 or (wall <= TIME_S and mb <= RSS_MB) else "NOT MET"
        target = f"<= {TIME_S:.0f} s, <= {RSS_MB:.0f} MB: {met}" if count >= 1_000_000 else ""
        print(f"whole run W8 {count:>9,d}: {wall:7.1f} s wall, peak {mb:6.0f} MB  {target}")


if __name__ == "__main__":
    main()
