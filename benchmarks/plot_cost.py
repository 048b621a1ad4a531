"""What plots cost: the matplotlib import, the drawing, and a whole run with and without them.

Usage: python benchmarks/plot_cost.py [--repeat 5] [--target RUN_OR_SWEEP]...

Prints, best of ``--repeat`` (the machine is shared: the minimum is the cost, the rest is
other jobs), with the load average:

1. the import, each in a fresh interpreter: ``matplotlib.figure`` with the Agg canvas (what
   :mod:`cpkv.plots` imports) and ``matplotlib.pyplot`` (what it no longer imports);
2. ``cpkv admit`` (the default two-tick run) with ``--plots`` and with ``--no-plots``: the
   difference is what plots add to a run;
3. the default run's plots drawn again in one process (:func:`cpkv.plots.records.plot_run`,
   the import already paid), as ``cpkv plot`` draws them;
4. ``cpkv plot TARGET`` for each ``--target`` (a run or a sweep directory), whole commands.

Numbers are printed, never judged (exit 0).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMPORTS = {
    "matplotlib.figure + backend_agg": "import matplotlib.figure, matplotlib.backends.backend_agg",
    "matplotlib.pyplot": "import matplotlib.pyplot",
    "numpy alone": "import numpy",
}


def best_wall(cmd: list[str], repeat: int, env: dict[str, str] | None = None) -> float:
    """The least wall time of ``repeat`` runs of ``cmd`` (output discarded)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=env)  # fmt: skip
        times.append(time.perf_counter() - t0)
    return min(times)


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--target", action="append", default=[], metavar="RUN_OR_SWEEP")
    args = parser.parse_args()
    if importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed: no plot to measure (pip install 'cpkv[plot]')")
        return 0
    py = sys.executable
    print(f"best of {args.repeat}, {os.cpu_count()} CPUs, {load()}")
    empty = best_wall([py, "-c", "pass"], args.repeat)
    for name, code in IMPORTS.items():
        wall = best_wall([py, "-c", code], args.repeat) - empty
        print(f"[1] import {name}: {wall:.3f} s (interpreter start-up {empty:.3f} s excluded)")

    env = {**os.environ, "CPKV_PLOTS": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        cpkv = [py, "-m", "cpkv", "admit", "-o", tmp]
        off = best_wall([*cpkv, "--no-plots"], args.repeat, env)
        on = best_wall([*cpkv, "--plots"], args.repeat, env)
        print(f"[2] cpkv admit: {off:.3f} s without plots, {on:.3f} s with --plots: "
              f"plots add {on - off:.3f} s ({load()})")  # fmt: skip
        run = next(p.parent for p in Path(tmp).rglob("plots"))
        print(f"[3] {draw_again(run, args.repeat)} ({load()})")

    for target in args.target:
        with tempfile.TemporaryDirectory() as out:
            wall = best_wall([py, "-m", "cpkv", "plot", target, "-o", out], args.repeat, env)
            files = sorted(p.name for p in Path(out).rglob("*.png"))
        print(f"[4] cpkv plot {target}: {wall:.3f} s, {len(files)} PNGs ({load()})")
    return 0


def draw_again(run: Path, repeat: int) -> str:
    """The default run's plots drawn ``repeat`` times in this process, the import paid first."""
    t0 = time.perf_counter()
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401

    from cpkv.plots.records import plot_run
    from cpkv.runs.rundir import load_run

    imported = time.perf_counter() - t0
    record = load_run(run).record
    times, names = [], []
    with tempfile.TemporaryDirectory() as out:
        for n in range(repeat):
            t0 = time.perf_counter()
            names = [p.name for p in plot_run(record, run, Path(out) / str(n))]
            times.append(time.perf_counter() - t0)
    return (f"drawing the default run's {len(names)} PNGs ({', '.join(names)}): first "
            f"{times[0]:.3f} s, best {min(times):.3f} s (import {imported:.3f} s before)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
