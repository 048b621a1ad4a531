"""The end of a long serving run (issue 18): how long the main process waits for the helper
process's last work (``Helper.finish``: the timeline's buckets and the summary), the whole
run's wall time, the peak resident memory of its process tree and the size of the samples'
temporary file, for the current code and a base commit, side by side, with the outputs
compared byte for byte.

Workloads: the issue's synthetic one (``benchmarks/serving_scale.py``'s, a million requests by
default) and the Azure conversation trace repeated to the same size, under the linear and
the default roofline cost models. Each run is a separate process importing its own tree (the
base is checked out into a temporary ``git worktree``), started through a small wrapper that
times ``Helper.finish`` and reads the spill's size in the helper before the end pass. The
base and the current run of each case alternate; ``--repeat N`` keeps the best of N.

    python benchmarks/serving_end_pass.py                  # 4 cases x 2 trees (about 4 min)
    python benchmarks/serving_end_pass.py --requests 200000 --no-azure

The machine is shared: read the ratios, repeat. Exit 1 when an output differs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from serving_scale import AZURE, AZURE_REQUESTS, SYNTHETIC, measured

ROOT = Path(__file__).resolve().parent.parent
BASE = "68055e7"  # the commit before the end pass moved into the run
WRAPPER = """\
import os, sys, time
from cpkv.serving import helper, timeline

finish = helper.Helper.finish
def timed(self, *args, **kwargs):
    start = time.perf_counter()
    out = finish(self, *args, **kwargs)
    print(f"END_PASS {time.perf_counter() - start:.4f}", file=sys.stderr, flush=True)
    return out
helper.Helper.finish = timed

def size(samples):  # in the helper, before the end pass
    spill = getattr(samples.spill, "file", samples.spill)
    size = 0
    if spill is not None:
        spill.flush()
        size = os.fstat(spill.fileno()).st_size
    print(f"SPILL {size} {samples.totals.iterations}", file=sys.stderr, flush=True)

if hasattr(timeline, "SpilledTimeline"):  # (this tree)
    start = timeline.SpilledTimeline.__init__
    def sized(self, samples, *args, **kwargs):
        size(samples)
        start(self, samples, *args, **kwargs)
    timeline.SpilledTimeline.__init__ = sized
else:  # (the base)
    buckets = timeline.timeline_and_time
    def sized(samples, *args, **kwargs):
        size(samples)
        return buckets(samples, *args, **kwargs)
    timeline.timeline_and_time = sized

from cpkv.cli import main
sys.argv = ["cpkv", *sys.argv[1:]]
main()
"""
OUTPUTS = ("requests.jsonl", "timeline.jsonl", "results.json")


def run(code: Path, wrapper: Path, args: list[str], out: Path) -> dict[str, float]:
    """One run of the tree ``code`` into ``out``: end pass and wall seconds, peak tree RSS
    (kB), spill bytes and iterations."""
    env = {**os.environ, "CPKV_PLOTS": "0"}
    command = [str(wrapper), "admit", *args, "--no-plots", "-o", str(out)]
    wall, peak, err = measured(code, command, env)
    found: dict[str, float] = {"wall": wall, "rss_kb": peak}
    for line in err.splitlines():
        if line.startswith("END_PASS "):
            found["end"] = float(line.split()[1])
        elif line.startswith("SPILL "):
            found["spill"], found["iterations"] = (float(v) for v in line.split()[1:3])
    if "end" not in found:
        raise SystemExit(f"no helper process in {' '.join(args)} ({code}): too few requests?")
    return found


def run_dir(out: Path) -> Path:
    (results,) = out.glob("*/*/results.json")
    return results.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE, help=f"the commit to compare with ({BASE})")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs of each")
    parser.add_argument("--no-azure", action="store_true", help="skip the repeated Azure trace")
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "synthetic.yaml"
        config.write_text(SYNTHETIC)
        wrapper = work / "wrapper.py"
        wrapper.write_text(WRAPPER)
        base = work / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base],
            check=True, capture_output=True,
        )  # fmt: skip
        cases = [("synthetic", [str(config), f"admit.workload.synthetic.count={args.requests}"])]
        if AZURE.is_file() and not args.no_azure:
            copies = max(1, round(args.requests / AZURE_REQUESTS))
            cases.append(("azure", [
                str(config), "admit.workload.source=trace", "admit.workload.format=azure_csv",
                f"admit.workload.path={AZURE}", f"admit.workload.repeat={copies}",
                "admit.arrivals.process=trace", "admit.slo.ttft_ms=2000", "admit.slo.tpot_ms=100",
            ]))  # fmt: skip
        try:
            print(f"base {args.base}, {args.requests:,} requests, best of {args.repeat}")
            print(f"{'workload':<10} {'cost':<9} {'iterations':>10}  {'end pass':>16} "
                  f"{'ratio':>6}  {'run':>14}  {'peak tree RSS':>15}  {'spill B/iter':>12}")  # fmt: skip
            for name, case in cases:
                for kind in ("linear", "roofline"):
                    runs: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
                    for i in range(args.repeat):
                        for label, code in (("base", base), ("this", ROOT)):
                            out = work / f"{label}-{name}-{kind}-{i}"
                            runs[label].append(
                                run(code, wrapper, [*case, f"admit.cost.kind={kind}"], out)
                            )
                    dirs = [run_dir(work / f"{label}-{name}-{kind}-0") for label in runs]
                    differ = [
                        f for f in OUTPUTS
                        if (dirs[0] / f).read_bytes() != (dirs[1] / f).read_bytes()
                    ]  # fmt: skip
                    failures += bool(differ)
                    b, c = ({k: min(r[k] for r in rs) for k in rs[0]} for rs in runs.values())
                    b["rss_kb"], c["rss_kb"] = (
                        max(r["rss_kb"] for r in rs) for rs in runs.values()
                    )
                    print(
                        f"{name:<10} {kind:<9} {c['iterations'] / 1e6:9.1f}M  "
                        f"{b['end']:6.2f}s -> {c['end']:5.2f}s {b['end'] / c['end']:5.1f}x  "
                        f"{b['wall']:5.1f}s -> {c['wall']:5.1f}s  "
                        f"{b['rss_kb'] / 1024:5.0f} -> {c['rss_kb'] / 1024:4.0f}MB  "
                        f"{b['spill'] / b['iterations']:5.1f} -> {c['spill'] / c['iterations']:4.1f}"
                        + ("" if not differ else f"  OUTPUTS DIFFER: {', '.join(differ)}")
                    )
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                check=False, capture_output=True,
            )  # fmt: skip
    print("outputs: identical" if not failures else f"outputs: {failures} case(s) differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
