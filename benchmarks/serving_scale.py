"""Serving at production scale (issue 18): time and peak memory of whole ``cpkv admit`` runs at
10k / 100k / 1M requests, for the current code and for the code as of a base commit (before
the issue's work), side by side in one run, with the ratios.

Workloads: the issue's synthetic one (prompt 1024, output 256, Poisson 8 req/s, iteration
budget 512, 16,384 x 16 blocks: ``configs/perf/serving_1m.yaml`` without its sweep) and the
Azure conversation trace's requests repeated to the size (``admit.workload.repeat``; the
base code cannot repeat a trace, so the current code only). Each run is a separate process
(``python -P -m cpkv admit ... -o <tmp>``, plots as ``--plots`` says) importing its own tree:
the base commit is checked out into a temporary ``git worktree`` (removed after). Measured:
wall time and the peak resident memory of the whole process tree (the sum over the run's
processes, sampled every 10 ms from ``/proc``). The base code has the linear cost model only;
the current code runs it (``admit.cost.kind=linear``) and the default roofline model.

At 10k and 100k requests (synthetic) the base's and the current code's linear outputs are
compared byte for byte (``requests.jsonl``; ``timeline.jsonl`` lines, whose current versions
add the time breakdown after the base's fields; the summary row). ``--mooncake`` also times
the shipped Mooncake trace configs against ``--mooncake-base`` (default ``main``).

    python benchmarks/serving_scale.py            # 10k, 100k, 1M (several minutes)
    python benchmarks/serving_scale.py --quick    # 10k and 100k
    python benchmarks/serving_scale.py --repeat 3 --mooncake

The machine is shared: repeat (best of ``--repeat``, runs alternating) and read the ratios.
Exit 1 when an output differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = "2ff6807"  # the commit before issue 18's work
SYNTHETIC = """\
kind: admit
name: scale
seed: 0
admit:
  policy: prefill_adder
  mode: serving
  workload:
    source: synthetic
    synthetic:
      count: 10000
      l1_cached_tokens: {choices: [0]}
      l2_cached_tokens: {choices: [0]}
      extend_tokens: {choices: [1024]}
      max_new_tokens: {choices: [256]}
  arrivals: {process: poisson, rate_rps: 8}
  iteration: {budget_tokens: 512}
  kv: {block_size: 16, capacity_blocks: 16384}
  slo: {ttft_ms: 100, tpot_ms: 12}
"""
AZURE = ROOT.parent / "shared/data/azure_llm_2023/conversation.csv"
AZURE_REQUESTS = 19_366
MOONCAKE_CONFIGS = ("configs/serving.yaml", "configs/admit/serving_mooncake.yaml")


def tree_rss_kb(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants, summed (kB)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            with open(f"/proc/{p}/task/{p}/children") as f:
                stack.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


def measured(code: Path, command: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Run ``python -P <command>`` on the tree ``code`` from the repository root: (wall
    seconds, peak tree RSS in kB, its stderr); exit with the error when it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-P", *command], cwd=ROOT, env={**env, "PYTHONPATH": str(code)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss_kb(proc.pid))
        time.sleep(0.01)
    wall = time.perf_counter() - start
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({code}):\n{err[-2000:]}")
    return wall, peak, err


def run(code: Path, args: list[str], plots: bool, keep: Path | None = None) -> tuple[float, int]:
    """One ``cpkv admit`` run of the tree ``code``: (wall seconds, peak tree RSS in kB); the
    run directory is copied to ``keep`` when given."""
    env = dict(os.environ)
    if not plots:
        env["CPKV_PLOTS"] = "0"
    with tempfile.TemporaryDirectory() as out:
        wall, peak, _ = measured(code, ["-m", "cpkv", "admit", *args, "-o", out], env)
        if keep is not None:
            (run_dir,) = [p.parent for p in Path(out).glob("*/*/results.json")]
            shutil.copytree(run_dir, keep)
    return wall, peak


def same_outputs(base: Path, new: Path) -> list[str]:
    """Differences between the base's and the current code's linear run directories."""
    problems = []
    if (base / "requests.jsonl").read_bytes() != (new / "requests.jsonl").read_bytes():
        problems.append("requests.jsonl")
    old = (base / "timeline.jsonl").read_text().splitlines()
    now = (new / "timeline.jsonl").read_text().splitlines()
    if len(old) != len(now) or any(
        not b.startswith(a[:-1] + ",") for a, b in zip(old, now, strict=False)
    ):
        problems.append("timeline.jsonl")
    rows = [json.loads((d / "results.json").read_text())["rows"] for d in (base, new)]
    if rows[0] != rows[1]:
        problems.append("results.json rows")
    return problems


def best(code: Path, args: list[str], plots: bool, repeat: int, keep: Path | None) -> tuple:
    results = [run(code, args, plots, keep if i == 0 else None) for i in range(repeat)]
    return min(r[0] for r in results), max(r[1] for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k and 100k requests only")
    parser.add_argument("--base", default=BASE, help=f"the commit to compare with ({BASE})")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs of each")
    parser.add_argument("--plots", action="store_true", help="draw the runs' plots too")
    parser.add_argument("--no-azure", action="store_true", help="skip the repeated Azure trace")
    parser.add_argument("--mooncake", action="store_true", help="time the Mooncake configs too")
    parser.add_argument("--mooncake-base", default="main")
    args = parser.parse_args()
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "synthetic.yaml"
        config.write_text(SYNTHETIC)
        trees = {"current": ROOT}
        added = []
        for name, rev in [("base", args.base)] + (
            [("mooncake-base", args.mooncake_base)] if args.mooncake else []
        ):
            tree = work / name
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                check=True, capture_output=True,
            )  # fmt: skip
            trees[name] = tree
            added.append(tree)
        try:
            print(f"base {args.base}, plots {'on' if args.plots else 'off'}, best of {args.repeat}")
            print(f"{'workload':<10} {'requests':>9}  {'code / cost':<18} {'time':>8} {'peak RSS':>9}"
                  f"  {'base/this time':>14} {'base/this RSS':>13}")  # fmt: skip
            for n in sizes:
                count = [str(config), f"admit.workload.synthetic.count={n}"]
                keep = n <= 100_000
                b = best(
                    trees["base"], count, args.plots, args.repeat, work / f"b{n}" if keep else None
                )
                print(
                    f"{'synthetic':<10} {n:>9,}  {'base (linear)':<18} {b[0]:7.2f}s {b[1] / 1024:7.0f}MB"
                )
                for kind in ("linear", "roofline"):
                    c = best(ROOT, [*count, f"admit.cost.kind={kind}"], args.plots, args.repeat,
                             work / f"c{n}" if keep and kind == "linear" else None)  # fmt: skip
                    print(f"{'synthetic':<10} {n:>9,}  {'current, ' + kind:<18} {c[0]:7.2f}s "
                          f"{c[1] / 1024:7.0f}MB  {b[0] / c[0]:13.2f}x {b[1] / c[1]:12.2f}x")  # fmt: skip
                if keep:
                    problems = same_outputs(work / f"b{n}", work / f"c{n}")
                    failures += bool(problems)
                    print(f"{'':<10} {'':>9}  linear outputs vs base: "
                          f"{'identical' if not problems else 'DIFFER: ' + ', '.join(problems)}")  # fmt: skip
            if AZURE.is_file() and not args.no_azure:
                for n in sizes:
                    copies = max(1, round(n / AZURE_REQUESTS))
                    limit = [f"admit.workload.limit={n}"] if n < AZURE_REQUESTS else []
                    requests = n if limit else copies * AZURE_REQUESTS
                    azure = [str(config), "admit.workload.source=trace",
                             "admit.workload.format=azure_csv", f"admit.workload.path={AZURE}",
                             f"admit.workload.repeat={copies}", "admit.arrivals.process=trace",
                             "admit.slo.ttft_ms=2000", "admit.slo.tpot_ms=100", *limit]  # fmt: skip
                    for kind in ("linear", "roofline"):
                        c = best(ROOT, [*azure, f"admit.cost.kind={kind}"], args.plots,
                                 args.repeat, None)  # fmt: skip
                        print(f"{'azure':<10} {requests:>9,}  {'current, ' + kind:<18} "
                              f"{c[0]:7.2f}s {c[1] / 1024:7.0f}MB")  # fmt: skip
            if args.mooncake:
                print(
                    f"Mooncake configs, {args.mooncake_base} vs current (best of {args.repeat}, alternating)"
                )
                for path in MOONCAKE_CONFIGS:
                    times = {"mooncake-base": [], "current": []}
                    for _ in range(args.repeat):
                        for name in times:
                            times[name].append(run(trees[name], [path], args.plots)[0])
                    b_t, c_t = min(times["mooncake-base"]), min(times["current"])
                    print(f"  {path:<40} {b_t:6.2f}s -> {c_t:6.2f}s  ({b_t / c_t:.2f}x)")
        finally:
            for tree in added:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    check=False, capture_output=True,
                )  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
