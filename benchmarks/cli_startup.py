"""How fast `cpkv --help` answers, and what `cpkv --help` and `cpkv admit` import.

Usage: python benchmarks/cli_startup.py [--runs N] [--budget-s 0.3]

1. `cpkv --help` (the installed console script, else `python -m cpkv`) runs ``--runs`` times
   as a fresh process; the median, min and max wall time are printed with the 0.3 s target.
   A warm-up run first fills the OS file cache.
2. `python -X importtime -m cpkv --help` and `python -X importtime -m cpkv admit` (the
   default experiment, written to a temporary folder) list every module they import; the
   script prints whether torch, numpy, omegaconf, sglang or matplotlib are among them
   (`cpkv admit` reads its config with omegaconf, so only torch, numpy, sglang and
   matplotlib are checked there) and the slowest imports of `cpkv --help`.

Exits 1 when a heavy module is imported; the median is reported against the budget with the
load average, not judged (the machine is shared).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HELP_FORBIDDEN = ("torch", "numpy", "omegaconf", "sglang", "matplotlib")
ADMIT_FORBIDDEN = ("torch", "numpy", "sglang", "matplotlib")


def help_command() -> list[str]:
    """The console script next to this Python when installed, else ``python -m cpkv``."""
    script = os.path.join(os.path.dirname(sys.executable), "cpkv")
    if os.path.exists(script):
        return [script, "--help"]
    found = shutil.which("cpkv")
    return [found, "--help"] if found else [sys.executable, "-m", "cpkv", "--help"]


def wall_times(cmd: list[str], runs: int) -> list[float]:
    """Wall seconds of ``runs`` fresh runs of ``cmd`` (after one untimed warm-up)."""
    subprocess.run(cmd, capture_output=True, check=True)
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        out.append(time.perf_counter() - t0)
    return out


def imports(args: list[str], cwd: str | None = None) -> dict[str, int]:
    """Module -> cumulative import time (us) of ``python -X importtime -m cpkv ARGS``."""
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cpkv", *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
    )
    out = {}
    for line in res.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:") :].split("|"))
        if cumulative.isdigit():
            out[name.strip()] = int(cumulative)
    return out


def heavy(found: dict[str, int], forbidden: tuple[str, ...]) -> list[str]:
    """The forbidden top-level packages among the imported modules."""
    tops = {name.split(".")[0] for name in found}
    return [m for m in forbidden if m in tops]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--budget-s", type=float, default=0.3)
    args = parser.parse_args()
    ok = True

    cmd = help_command()
    times = wall_times(cmd, args.runs)
    median = statistics.median(times)  # (a timing is reported, not judged: the machine is shared)
    print(f"[1] `{' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}` "
          f"x{args.runs}: median {median:.3f} s (min {min(times):.3f}, max {max(times):.3f}); "
          f"target < {args.budget_s} s: {'ok' if median < args.budget_s else 'over'} "
          f"(load average {os.getloadavg()[0]:.1f})")  # fmt: skip

    found = imports(["--help"])
    bad = heavy(found, HELP_FORBIDDEN)
    ok &= not bad
    print(f"[2] `python -X importtime -m cpkv --help`: {len(found)} modules; "
          f"{', '.join(HELP_FORBIDDEN)} imported: {', '.join(bad) or 'none'}")  # fmt: skip
    slowest = sorted(((us, m) for m, us in found.items() if "." not in m), reverse=True)[:5]
    print(
        "    slowest top-level imports: "
        + ", ".join(f"{m} {us / 1000:.0f} ms" for us, m in slowest)
    )

    with tempfile.TemporaryDirectory() as tmp:  # the admission path alone, then with plots/
        found = imports(["admit", "--no-plots", "-o", tmp], cwd=tmp)
        drawn = ["--plots"] if importlib.util.find_spec("matplotlib") else []
        plotted = imports(["admit", *drawn, "-o", tmp], cwd=tmp)
    bad = heavy(found, ADMIT_FORBIDDEN)
    ok &= not bad
    print(f"[3] `python -X importtime -m cpkv admit --no-plots` (default experiment): {len(found)} "
          f"modules; {', '.join(ADMIT_FORBIDDEN)} imported: {', '.join(bad) or 'none'}")  # fmt: skip
    torch = "torch" in heavy(plotted, ("torch",))
    ok &= not torch
    print(f"    with plots/ (matplotlib installed: {'matplotlib' in heavy(plotted, ('matplotlib',))}): "
          f"{len(plotted)} modules; torch imported: {'yes' if torch else 'no'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
