"""Does `cpkv diff` say "no change" when nothing changed? Identical code, identical config, a busy machine.

Usage: python benchmarks/diff_noise.py [--tries 20] [--rounds 5] [--config configs/alloc_host.yaml]
                                        [--plain] [--tries-plain N]

1. Runs the config twice (A and B: the same code and config) into a temporary folder.
2. ``--tries`` times, ``cpkv diff A B --rerun --rounds N --format json``, each a fresh process
   (as a user runs it: its first round pays the imports): both configs run again, A, B, A,
   B, ..., and the rounds are judged in pairs. Each try prints its verdict, how many timing
   changes went beyond the factor (and were noise), the largest per-row change, and its time.
3. With ``--plain``: ``--tries-plain`` times (default ``--tries``), two fresh runs one after
   the other and a plain ``cpkv diff`` of them (the rank test on saved samples plus the
   factor), for comparison.

Prints "no change: K of T" for each mode with the target (at least 95 %: 19 of 20) and the
load average before and after. A timing result on a shared machine is reported, not
asserted: exits 0 whatever the count, 2 when a command fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NO_CHANGE = "no significant change"


def cpkv() -> list[str]:
    """The console script next to this Python when installed, else ``python -m cpkv``."""
    script = Path(sys.executable).parent / "cpkv"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cpkv"]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min; {os.cpu_count()} CPUs)"


def run_config(config: str, root: Path) -> Path:
    """Run ``config`` once under ``root`` with its kind's command; the new run directory."""
    before = set(root.rglob("meta.json")) if root.exists() else set()
    command = _command(config)
    res = subprocess.run(
        [*cpkv(), *command, config, "-o", str(root)],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    if res.returncode != 0:
        raise SystemExit(f"diff_noise: {' '.join(command)} {config} failed: {res.stderr.strip()}")
    (new,) = set(root.rglob("meta.json")) - before
    return new.parent


def _command(config: str) -> list[str]:
    """``alloc host`` or ``alloc l1``, from the config's ``kind:`` line."""
    for line in (REPO / config).read_text().splitlines():
        if line.startswith("kind:"):
            kind = line.split(":", 1)[1].split("#")[0].strip()
            if kind in ("alloc_host", "alloc_l1"):
                return ["alloc", kind.removeprefix("alloc_")]
    raise SystemExit(f"diff_noise: {config}: not an allocator config (kind alloc_host or alloc_l1)")


def judge(args: list[str]) -> dict:
    """``cpkv diff ARGS --format json``: its document (exit 0 or 1), else stop."""
    res = subprocess.run(
        [*cpkv(), "diff", *args, "--format", "json"], capture_output=True, text=True, cwd=REPO
    )
    if res.returncode not in (0, 1):
        raise SystemExit(f"diff_noise: cpkv diff {' '.join(args)}: {res.stderr.strip()}")
    return json.loads(res.stdout)


def describe(doc: dict) -> str:
    """The verdict, the timing changes beyond the factor, the largest per-row change."""
    rules = doc.get("timing_rules") or {}
    beyond = sum(rules.values())
    changes = [c for c in doc["changes"] if c.get("ratio") and c.get("p_value") is not None]
    worst = max(changes, key=lambda c: abs(math.log(c["ratio"])), default=None)
    far = (
        f"largest {worst['metric']} x{worst['ratio']:.3f} (q {worst['p_value']:.2g})"
        if worst
        else "no timing change beyond the factor"
    )
    judged = [c["p_value"] for c in changes if c.get("rule")]
    closest = f"smallest q beyond the factor {min(judged):.2g}" if judged else "-"
    return f"{doc['verdict']} | beyond the factor: {beyond} | {far} | {closest}"


def is_no_change(doc: dict) -> bool:
    counts = doc["counts"]
    return not doc["regression"] and counts["worse"] == 0 and counts["better"] == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--config", default="configs/alloc_host.yaml")
    parser.add_argument("--plain", action="store_true", help="also judge plain diffs of fresh runs")
    parser.add_argument("--tries-plain", type=int, default=None)
    args = parser.parse_args()
    print(f"config {args.config}; load average {load()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="cpkv-diff-noise-"))
    try:
        a, b = run_config(args.config, tmp / "ab"), run_config(args.config, tmp / "ab")
        print(f"A, B: two runs of {args.config} (identical code and config)", flush=True)
        results = {}
        started = time.perf_counter()
        ok = 0
        for i in range(1, args.tries + 1):
            t0 = time.perf_counter()
            doc = judge([str(a), str(b), "--rerun", "--rounds", str(args.rounds)])
            ok += is_no_change(doc)
            print(f"rerun {i:2d}/{args.tries}: {describe(doc)} | {time.perf_counter() - t0:.0f} s",
                  flush=True)  # fmt: skip
        results["rerun"] = (ok, args.tries, time.perf_counter() - started)
        if args.plain:
            tries = args.tries_plain or args.tries
            started, ok = time.perf_counter(), 0
            for i in range(1, tries + 1):
                t0 = time.perf_counter()
                pa, pb = (
                    run_config(args.config, tmp / "plain"),
                    run_config(args.config, tmp / "plain"),
                )
                doc = judge([str(pa), str(pb)])
                ok += is_no_change(doc)
                print(f"plain {i:2d}/{tries}: {describe(doc)} | {time.perf_counter() - t0:.0f} s",
                      flush=True)  # fmt: skip
                shutil.rmtree(pa), shutil.rmtree(pb)
            results["plain"] = (ok, tries, time.perf_counter() - started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    for mode, (ok, tries, seconds) in results.items():
        how = (
            f"--rerun --rounds {args.rounds}" if mode == "rerun" else "two runs, then a plain diff"
        )
        aim = math.ceil(0.95 * tries)
        print(
            f"{mode} ({how}): no change: {ok} of {tries} (target >= {aim}; {seconds / 60:.1f} min)"
        )
    print(f"load average {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
