"""Serving at production scale: whole ``cpkv admit`` runs of a base tree (main's code) and of
the current tree side by side in one run, with the ratios and the targets, met or not.

Groups (``--only``, several allowed; all by default):

* ``w1m``: the synthetic workload W (prompt 1024, output 256, Poisson 8 req/s, iteration
  budget 512, 16,384 x 16 blocks: ``SYNTHETIC`` below) at 1,000,000 requests, policies
  ``prefill_adder`` and ``iteration``, cost ``roofline`` (the default) and ``linear``. Targets
  (absolute, the current tree): <= 15 s and <= 400 MB.
* ``azure``: the Azure conversation trace (``../shared/data/azure_llm_2023``) repeated to a
  million requests (``admit.workload.repeat``, 52 copies), roofline. Target: <= 15 s.
* ``saturated``: W at 20 and at 60 req/s, 100,000 requests, both policies, both costs.
  Target: the current tree >= 3x faster than the base.
* ``configs``: the shipped Mooncake and Azure configs (those in both trees), the base and the
  current tree each running its own copy. Target: the current not slower (time ratio >= 1,
  within ``--noise``).

Each run is a separate process (``python -P -m cpkv admit ... -o <tmp>``, from the repository
root, ``PYTHONPATH`` the tree's root; no plots unless ``--plots``). Measured: wall time and the
peak resident memory of the whole process tree (the sum over the run's processes, sampled every
10 ms from ``/proc``; MB = 10^6 bytes). Each pair runs interleaved (base, current, base,
current, ...), ``--repeat`` times; a row shows the best (least) time of each side and the
largest peak RSS. Bytecode goes to a temporary ``PYTHONPYCACHEPREFIX`` (the trees stay as
they are), written by an untimed warm-up (``warm_up``), so no timed run compiles.
``--quick`` divides every request count by 10 (the shipped configs get
``admit.workload.limit``): a smoke run, whose absolute targets are not judged.

The base's 1M runs are slow (the iteration policy ~150 s each): ``--skip-base-1m`` does not
run the base at 1M (their targets are absolute), ``--base-time ROW=SECONDS`` fills in a time
measured earlier instead (``ROW`` as in the table, e.g. ``W8/iteration/linear``; marked ``*``).

Engines: every ``prefill_adder`` and ``iteration`` row runs cpkv's loop (``admit.engine=cpkv``
in the current tree; the base has no other), and each ``prefill_adder`` row has a ``sglang``
row beside it, SGLang's own loop (``admit.engine=sglang``, the default engine of such configs),
and on the synthetic workloads a ``vllm`` row, vLLM's scheduler (``admit.engine=vllm``, its
own budgets: ``max_num_batched_tokens`` 2048, ``max_num_seqs`` 128), both in the current
tree only: their targets are the absolute ones (w1m, azure), no ratio elsewhere. The
iteration budget of 512 is an override of the ``iteration`` rows (vLLM's engine refuses a
config that sets SGLang's budgets).

This script does not compare outputs (``benchmarks/golden.py`` does, with a tolerance).

    python benchmarks/serving_scale.py                        # everything (tens of minutes)
    python benchmarks/serving_scale.py --quick --repeat 1     # smoke run (minutes)
    python benchmarks/serving_scale.py --only saturated,configs --repeat 3
    python benchmarks/serving_scale.py --only w1m --skip-base-1m --repeat 2

``--base`` is a directory (a checkout) or a revision (checked out into a temporary ``git
worktree``, removed after); ``--current`` a directory (the repository root). The machine is
shared: use ``--repeat`` and never run two benchmarks at once. Targets are reported (met /
NOT MET), not judged by the exit status, which is 1 only when a run failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BASE_REV = "e29b3d4"  # main before the serving refactor
BASE_DIR = ROOT.parent / "base"  # its worktree, where one is checked out
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
  kv: {block_size: 16, capacity_blocks: 16384}
  slo: {ttft_ms: 100, tpot_ms: 12}
"""
AZURE = ROOT.parent / "shared/data/azure_llm_2023/conversation.csv"
AZURE_REQUESTS = 19_366
# (table name, path, requests in its trace): all prefill_adder, roofline
CONFIGS = (
    ("serving", "configs/serving.yaml", 3_993),
    ("mooncake", "configs/admit/serving_mooncake.yaml", 3_993),
    ("azure_conv_8b", "configs/admit/serving_azure_conv_llama3_8b_a100.yaml", 19_366),
    ("azure_code_70b", "configs/admit/serving_azure_code_llama2_70b_h100x4.yaml", 8_819),
)
GROUPS = ("w1m", "azure", "saturated", "configs")
POLICIES = ("prefill_adder", "iteration")
COSTS = ("roofline", "linear")
ITERATION_BUDGET = "admit.iteration.budget_tokens=512"  # (the iteration policy's rows only)
ENGINES = {"sglang": "SGLang's loop", "vllm": "vLLM's scheduler"}
"""The engines beside cpkv's loop (rows of the current tree only), by row policy name."""
TIME_S, RSS_MB, SPEEDUP = 15.0, 400.0, 3.0


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


@dataclass
class Side:
    """One tree's runs of a row: best time, largest peak RSS (kB), or why there are none."""

    times: list[float] = field(default_factory=list)
    peaks: list[int] = field(default_factory=list)
    error: str = ""
    given: float | None = None  # --base-time
    skipped: bool = False

    @property
    def time(self) -> float | None:
        return self.given if self.given is not None else min(self.times, default=None)

    @property
    def mb(self) -> float | None:
        return max(self.peaks) * 1024 / 1e6 if self.peaks else None

    def cell(self) -> str:
        if self.error:
            return "failed"
        if self.time is None:
            return "-"
        return f"{self.time:.2f}s" + ("*" if self.given is not None else "")


@dataclass
class Row:
    group: str
    workload: str
    requests: int
    policy: str
    cost: str
    args: dict[str, list[str]]  # per side: the ``cpkv admit`` arguments
    base: Side = field(default_factory=Side)
    current: Side = field(default_factory=Side)

    @property
    def name(self) -> str:
        return f"{self.workload}/{self.policy}/{self.cost}"

    @property
    def ratio(self) -> float | None:
        b, c = self.base.time, self.current.time
        return b / c if b is not None and c else None


def admit(code: Path, args: list[str], plots: bool) -> tuple[float, int]:
    """One ``cpkv admit`` run of the tree ``code``: (wall seconds, peak tree RSS in kB)."""
    env = {**os.environ, "CPKV_PLOTS": "1" if plots else "0"}
    with tempfile.TemporaryDirectory() as out:
        wall, peak, _ = measured(code, ["-m", "cpkv", "admit", *args, "-o", out], env)
    return wall, peak


def rows_for(groups: list[str], config: Path, trees: dict[str, Path], scale: int) -> list[Row]:
    """The table's rows (nothing run yet); request counts divided by ``scale``."""
    rows = []

    def pair(
        group: str, workload: str, n: int, policy: str, cost: str, a: Any,
        engines: tuple[str, ...] = ("sglang",),
    ) -> None:  # fmt: skip
        """cpkv's loop in both trees (the base's only loop) and, for ``prefill_adder``, the
        other ``engines`` (SGLang's loop is the default engine of such configs) in the
        current tree only."""
        both = a if isinstance(a, dict) else {"base": a, "current": a}
        cpkv = {**both, "current": [*both["current"], "admit.engine=cpkv"]}
        rows.append(Row(group, workload, n, policy, cost, cpkv))
        for engine in engines if policy == "prefill_adder" else ():
            other = Row(group, workload, n, engine, cost,
                        {"current": [*both["current"], f"admit.engine={engine}"]})  # fmt: skip
            other.base.skipped = True
            rows.append(other)

    def synthetic(group: str, rate: int, n: int) -> None:
        for policy in POLICIES:
            for cost in COSTS:
                a = [str(config), f"admit.workload.synthetic.count={n}",
                     f"admit.arrivals.rate_rps={rate}", f"admit.policy={policy}",
                     f"admit.cost.kind={cost}"]  # fmt: skip
                if policy == "iteration":
                    a.append(ITERATION_BUDGET)
                pair(group, f"W{rate}", n, policy, cost, a, tuple(ENGINES))

    for group in groups:
        if group == "w1m":
            synthetic(group, 8, 1_000_000 // scale)
        elif group == "saturated":
            for rate in (20, 60):
                synthetic(group, rate, 100_000 // scale)
        elif group == "azure" and AZURE.is_file():
            copies = max(1, round(1_000_000 / scale / AZURE_REQUESTS))
            a = [str(config), "admit.workload.source=trace", "admit.workload.format=azure_csv",
                 f"admit.workload.path={AZURE}", f"admit.workload.repeat={copies}",
                 "admit.arrivals.process=trace", "admit.slo.ttft_ms=2000",
                 "admit.slo.tpot_ms=100", "admit.cost.kind=roofline"]  # fmt: skip
            pair(group, f"azure{copies}", copies * AZURE_REQUESTS, "prefill_adder", "roofline", a)
        elif group == "azure":
            print(f"azure: {AZURE} not found, skipped")
        elif group == "configs":
            for name, path, n in CONFIGS:
                missing = [s for s, t in trees.items() if not (t / path).is_file()]
                if missing:
                    print(f"configs: {path} not in the {' and '.join(missing)} tree, skipped")
                    continue
                limit = [f"admit.workload.limit={n // scale}"] if scale > 1 else []
                a = {s: [str(t / path), *limit] for s, t in trees.items()}
                pair(group, name, n // scale, "prefill_adder", "roofline", a)
    return rows


def measure(row: Row, trees: dict[str, Path], repeat: int, plots: bool) -> None:
    """Run the row's pair interleaved (base, current, base, ...), ``repeat`` times."""
    for _ in range(repeat):
        for name in ("base", "current"):
            side: Side = getattr(row, name)
            if side.error or side.skipped or side.given is not None:
                continue
            try:
                wall, peak = admit(trees[name], row.args[name], plots)
            except SystemExit as e:
                side.error = str(e)
                continue
            side.times.append(wall)
            side.peaks.append(peak)


def mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}MB"


def target_text(row: Row) -> str:
    if row.group == "w1m":
        return f"<={TIME_S:.0f}s <={RSS_MB:.0f}MB"
    if row.group == "azure":
        return f"<={TIME_S:.0f}s"
    if row.group == "saturated":
        return f"ratio>={SPEEDUP:.0f}x"
    return "ratio>=1"


def verdicts(row: Row, quick: bool, noise: float) -> list[tuple[str, bool | None]]:
    """(line, met) per target of the row; met None where not judged."""
    c, r = row.current, row.ratio
    out: list[tuple[str, bool | None]] = []
    if row.base.skipped and row.group not in ("w1m", "azure"):
        return [(f"{row.name}: {ENGINES[row.policy]}, not in the base (no ratio)", None)]
    if row.group in ("w1m", "azure"):
        checks = [("time", c.time, TIME_S, "s")]
        if row.group == "w1m":
            checks.append(("peak RSS", c.mb, RSS_MB, "MB"))
        for what, value, limit, unit in checks:
            shown = "failed" if c.error else "-" if value is None else f"{value:.2f}{unit}"
            line = f"{row.name}: current {what} {shown} <= {limit:.0f}{unit}"
            if quick:
                out.append((line, None))
            else:
                out.append((line, value is not None and value <= limit))
    elif row.group == "saturated":
        shown = "-" if r is None else f"{r:.2f}x"
        out.append((f"{row.name}: current >= {SPEEDUP:.0f}x faster than base ({shown})",
                    r is not None and r >= SPEEDUP))  # fmt: skip
    else:
        shown = "-" if r is None else f"{r:.2f}x"
        met = r is not None and r >= 1 - noise
        note = " within noise" if met and r is not None and r < 1 else ""
        out.append((f"{row.name}: current not slower than base ({shown}{note})", met))
    return out


def warm_up(trees: dict[str, Path], config: Path, prefix: Path) -> None:
    """Bytecode for every run, untimed: every later run (this process's environment) reads
    and writes it under ``prefix`` (the trees stay as they are; ``PYTHONDONTWRITEBYTECODE``,
    if set, would have every run compile its tree); each tree is byte-compiled, then runs a
    few tiny ``cpkv admit``s touching what the rows use (a warm-up's failure is the row's to
    report)."""
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    tiny = [str(config), "admit.workload.synthetic.count=200"]
    runs = [[*tiny, "admit.policy=iteration", "admit.cost.kind=roofline", ITERATION_BUDGET],
            [*tiny, "admit.policy=prefill_adder", "admit.cost.kind=linear"],
            [*tiny, "admit.engine=vllm", "admit.cost.kind=linear"]]  # fmt: skip
    if AZURE.is_file():
        runs.append([*tiny, "admit.workload.source=trace", "admit.workload.format=azure_csv",
                     f"admit.workload.path={AZURE}", "admit.workload.repeat=2",
                     "admit.workload.limit=200", "admit.arrivals.process=trace"])  # fmt: skip
    for tree in dict.fromkeys(trees.values()):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "cpkv")],
                       check=False, capture_output=True)  # fmt: skip
        shipped = [str(tree / path) for _, path, _ in CONFIGS if (tree / path).is_file()]
        for args in [*runs, *([[shipped[0], "admit.workload.limit=200"]] if shipped else [])]:
            try:
                admit(tree, args, plots=False)
            except SystemExit:
                pass


def worktree(rev: str, into: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev],
        check=True, capture_output=True,
    )  # fmt: skip
    return into


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--base", default=None, help=f"a directory or a revision (default: "
                        f"{BASE_DIR} if it exists, else {BASE_REV})")  # fmt: skip
    parser.add_argument("--current", default=str(ROOT), help="a directory (the repository root)")
    parser.add_argument("--quick", action="store_true", help="10x fewer requests everywhere")
    parser.add_argument("--only", action="append", default=[],
                        help=f"groups, comma-separated: {', '.join(GROUPS)}")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="best of N interleaved pairs")
    parser.add_argument("--skip-base-1m", action="store_true",
                        help="do not run the base at 1M requests (w1m, azure)")  # fmt: skip
    parser.add_argument("--base-time", action="append", default=[], metavar="ROW=SECONDS",
                        help="a base time measured earlier, for a 1M row (not run)")  # fmt: skip
    parser.add_argument("--noise", type=float, default=0.05,
                        help="configs: ratio >= 1 - NOISE counts as not slower (0.05)")  # fmt: skip
    parser.add_argument("--plots", action="store_true", help="draw the runs' plots too")
    args = parser.parse_args()
    groups = [g for spec in args.only for g in spec.split(",") if g] or list(GROUPS)
    if unknown := sorted(set(groups) - set(GROUPS)):
        parser.error(f"--only: unknown {', '.join(unknown)} (groups: {', '.join(GROUPS)})")
    given = {}
    for spec in args.base_time:
        key, sep, value = spec.partition("=")
        if not sep:
            parser.error(f"--base-time {spec}: ROW=SECONDS")
        given[key] = float(value)
    current = Path(args.current).resolve()
    if not (current / "cpkv").is_dir():
        parser.error(f"--current {current}: no cpkv/ there")
    base_spec = args.base or (str(BASE_DIR) if BASE_DIR.is_dir() else BASE_REV)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        added = None
        if Path(base_spec).is_dir():
            base = Path(base_spec).resolve()
        else:
            base = added = worktree(base_spec, work / "base")
        try:
            trees = {"base": base, "current": current}
            config = work / "synthetic.yaml"
            config.write_text(SYNTHETIC)
            rows = rows_for(groups, config, trees, 10 if args.quick else 1)
            for row in rows:
                if row.group in ("w1m", "azure"):
                    if row.name in given:
                        row.base.given = given.pop(row.name)
                    elif args.skip_base_1m:
                        row.base.skipped = True
            if given:
                parser.error(f"--base-time: no 1M row {', '.join(given)}")
            warm_up(trees, config, work / "pycache")
            return report(rows, trees, args)
        finally:
            if added is not None:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(added)],
                    check=False, capture_output=True,
                )  # fmt: skip


def report(rows: list[Row], trees: dict[str, Path], args: argparse.Namespace) -> int:
    print(f"base {trees['base']}, current {trees['current']}")
    print(f"best of {args.repeat} interleaved, plots {'on' if args.plots else 'off'}"
          f"{', quick (requests / 10)' if args.quick else ''}; ratio = base time / current time")  # fmt: skip
    head = (f"{'workload':<14} {'requests':>9} {'policy':<13} {'cost':<8} {'base':>8} "
            f"{'current':>8} {'ratio':>7} {'base RSS':>8} {'cur RSS':>8}  target")  # fmt: skip
    print(head)
    print("-" * len(head))
    started = time.perf_counter()
    for row in rows:
        measure(row, trees, args.repeat, args.plots)
        r = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        print(f"{row.workload:<14} {row.requests:>9,} {row.policy:<13} {row.cost:<8} "
              f"{row.base.cell():>8} {row.current.cell():>8} {r:>7} {mb(row.base.mb):>8} "
              f"{mb(row.current.mb):>8}  {target_text(row)}", flush=True)  # fmt: skip
    print(f"({time.perf_counter() - started:.0f} s in all; * = --base-time, not run)")
    print()
    bad = 0
    for row in rows:
        for line, met in verdicts(row, args.quick, args.noise):
            word = "n/a" if met is None else "met" if met else "NOT MET"
            bad += met is False
            quick = met is None and args.quick and "not in the base" not in line
            print(f"{word:<8} {line}" + (" (not judged: --quick)" if quick else ""))
    failed = [(row, s, getattr(row, s)) for row in rows for s in ("base", "current")]
    failed = [(row, s, side) for row, s, side in failed if side.error]
    for row, s, side in failed:
        tail = side.error.strip().splitlines()[-3:]
        print(f"\n{row.name} ({s}) failed:\n  " + "\n  ".join(t[:106] for t in tail))
    return 1 if failed else 0  # (targets are reported, not judged: the machine is shared)


if __name__ == "__main__":
    sys.exit(main())
