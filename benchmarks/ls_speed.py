"""How long ``cpkv ls`` takes over many runs: N run directories made from one real run, listed.

Usage: python benchmarks/ls_speed.py [--runs 10000] [--source RUN_DIR] [--corrupt 10]
       [--repeat 3] [--keep DIR]

The source (default: a small serving run made here, ``configs/serving.yaml`` with 5 requests
and 10 timeline points) is copied ``--runs`` times into a temporary root, one directory a
second apart (``<day>/<HH-MM-SS-ffffff>_<name>``; each file hard-linked, or copied where links
are not allowed), and ``--corrupt`` of them get a ``results.json`` cut in half (a fresh file,
not the linked one). Then, best of ``--repeat``: ``cpkv ls ROOT`` (text) and ``cpkv ls ROOT -f
json`` as commands (start-up included), and ``list_entries`` in this process (the listing
alone). Prints the wall and CPU times, the time per run and the load average, and checks the
listing: every run once, the corrupt ones ``corrupt``, the others ``complete``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPKV = [sys.executable, "-m", "cpkv"]


def make_source(folder: Path) -> Path:
    """A small finished serving run under ``folder``; its directory."""
    out = folder / "source"
    subprocess.run(
        [*CPKV, "admit", "configs/serving.yaml", "admit.workload.limit=5",
         "admit.serving.timeline_points=10", "-o", str(out)],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    return next(p.parent for p in out.rglob("results.json"))


def build(source: Path, root: Path, runs: int, corrupt: int) -> list[Path]:
    """``runs`` copies of ``source`` under ``root``; the first ``corrupt`` damaged."""
    files = [p for p in source.iterdir() if p.is_file()]
    name = source.name.split("_", 1)[1]
    start = datetime(2026, 1, 1)
    made = []
    for k in range(runs):
        t = start + timedelta(seconds=k)
        run = root / t.strftime("%Y-%m-%d") / f"{t.strftime('%H-%M-%S-%f')}_{name}"
        run.mkdir(parents=True)
        for f in files:
            try:
                os.link(f, run / f.name)
            except OSError:
                shutil.copyfile(f, run / f.name)
        made.append(run)
    for run in made[:corrupt]:
        text = (run / "results.json").read_text()
        (run / "results.json").unlink()  # a fresh file: the linked one is every run's
        (run / "results.json").write_text(text[: len(text) // 2])
    return made


def best_of(repeat: int, fn) -> tuple[float, float, object]:
    """The least wall time of ``repeat`` calls, the least CPU time (this process and its
    children: user + system), the last result."""
    best, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        c0, t0 = _cpu(), time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        cpu = min(cpu, _cpu() - c0)
    return best, cpu, out


def _cpu() -> float:
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--source", type=Path, default=None, help="a finished run directory")
    parser.add_argument("--corrupt", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="build here and keep it")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cpkv-ls-"))
    try:
        source = args.source or make_source(work)
        root = args.keep or work / "runs"
        t0 = time.perf_counter()
        build(source, root, args.runs, args.corrupt)
        print(f"built {args.runs:,} runs from {source} in {time.perf_counter() - t0:.1f} s")

        def command(*extra: str) -> str:
            res = subprocess.run([*CPKV, "ls", str(root), *extra], cwd=ROOT,
                                 capture_output=True, text=True, check=True)  # fmt: skip
            return res.stdout

        sys.path.insert(0, str(ROOT))
        from cpkv.sweep.listing import list_entries

        text_s, text_cpu, _ = best_of(args.repeat, command)
        json_s, json_cpu, out = best_of(args.repeat, lambda: command("-f", "json"))
        inner_s, inner_cpu, entries = best_of(args.repeat, lambda: list_entries(root))
        listed = json.loads(out)
        statuses = [e["status"] for e in listed]
        ok = (
            len(listed) == args.runs
            and statuses.count("corrupt") == args.corrupt
            and statuses.count("complete") == args.runs - args.corrupt
            and len(entries) == args.runs
        )
        per = 1e3 / max(1, args.runs)
        print(f"{'what':<28}{'best s':>9}{'ms / run':>10}{'cpu s':>8}")
        for what, s, cpu in (("cpkv ls ROOT", text_s, text_cpu),
                             ("cpkv ls ROOT -f json", json_s, json_cpu),
                             ("list_entries (in process)", inner_s, inner_cpu)):  # fmt: skip
            print(f"{what:<28}{s:>9.2f}{s * per:>10.3f}{cpu:>8.2f}")
        print(
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall time "
            "grows with the load; CPU time much less)"
        )
        print(
            f"listing {'as expected' if ok else 'NOT as expected'}: {len(listed):,} entries, "
            f"{statuses.count('corrupt')} corrupt, {statuses.count('complete'):,} complete"
        )
        return 0 if ok else 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
