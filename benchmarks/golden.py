"""Golden outputs: prove that a refactor or an optimisation did not change behaviour.

Usage, from the repository root with the venv active. Record the reference once, with the code
of the tree before the refactor (``--code``: the tree whose code runs; default the working
tree), then compare the working tree with it as often as needed, without re-running the base:

    python benchmarks/golden.py --record /work/golden/configs --code /work/base --limit 60
    python benchmarks/golden.py --random 300 --seed 0 --record /work/golden/random --code /work/base
    python benchmarks/golden.py --against /work/golden/configs        # the working tree's code
    python benchmarks/golden.py --against /work/golden/random [--only s0042] [--random 50]
    python benchmarks/golden.py --base HEAD~3 [--random 50 --seed 1]  # both trees, nothing kept

What runs. Without ``--random``: every config under ``configs/`` (sweep configs as sweeps;
``--only`` keeps the paths that contain its text). With ``--random N``: N random serving
scenarios (``admit.mode: serving``) drawn from ``--seed`` (:func:`scenario`): every
``admit.policy``, the waiting-queue orders, priorities, deadlines, cancellations, queue
timeouts, requeue / swap / abort preemption, CUDA-graph buckets, safety margins, victims and
scans, chunking and iteration budgets, small pools that preempt and prompts that never fit,
linear and roofline costs, 2-3 instances behind every router, fixed L1/L2 hits and Mooncake /
Azure traces through the prefix cache; 5-300 requests each. A scenario is a config file and a
JSONL workload (``scenario.yaml``, ``workload.jsonl``), run as ``python -P -m cpkv admit
scenario.yaml admit.workload.path=.../workload.jsonl``; ``--record`` keeps both, and
``--against`` replays the recorded files, not new draws. A scenario the base refuses with exit
2 (an illegal combination: a few are drawn on purpose) is skipped and counted, after checking
that the other tree refuses it too; another failure of the base is recorded and must recur.

Each tree is imported from its own directory (``PYTHONPATH``, ``python -P``) and runs from the
repository root, reading the working tree's config files. A config that takes longer than
``--limit`` seconds with the reference code is left out (listed as such); the compared tree
gets 3 x ``--limit``. With ``--against``, ``--random N`` compares the first N recorded
scenarios only (a quick check) and ``--only`` the names that contain its text.

What is compared, per run directory (meta.json and config.yaml are not):

* ``results.json`` without timing: the fields its ``columns.timing`` declares,
  ``summary.timing``, the summary's ``*_us`` keys, the notes that start with ``timing:`` (for the
  allocator benches also the ``vs_*`` ratios, the headline and the notes);
* ``results.txt`` without those summary lines (not for the allocator benches);
* ``ticks.jsonl`` (without its ``*_us`` wall-clock fields), ``requests.jsonl``,
  ``timeline.jsonl``, ``growth.jsonl``, ``instances.jsonl``, ``trace.json``.

Serving runs (``summary.mode == serving``) are compared with a tolerance, the others byte for
byte (``--bytes``: every run byte for byte). The tolerant comparison parses the JSON files
(JSONL line by line) and walks them together: the same keys, the same number of list entries,
every string, integer, bool and null equal; a number that is a float in either file is equal
when ``abs(a - b) <= max(REL * max(abs(a), abs(b)), FLOOR)`` (``--tolerance REL``, default
1e-9; ``--abs-floor FLOOR``, default 1e-9: below 1e-9 in absolute value, e.g. a timeline mean
near 0, the relative test alone would demand exact equality; the outputs print times at 1e-6 ms
at most, so the floor never hides a printed difference). Decisions (who is admitted, chunked,
preempted, finished, rejected, timed out, in which iteration) are integers and strings, so
they must match exactly; only times and ratios get the tolerance. In ``results.json`` every
string (the notes) is compared with its float literals replaced by ``#``, and ``results.txt``
the same way, blanks and table rules collapsed: their rounded display of a float may differ in
the last digit, and the values themselves are compared in ``results.json``. Key order in a JSON
object is not compared. The first difference of each file is reported as ``label/file:line:
path``. The outputs round some floats (timeline percentages to 4 decimals, times to 6): two
values a rounding apart may print one unit apart in the last digit, far more than 1e-9
relative; such a difference is reported with ``(one unit in the last printed digit)``, and
``--last-digit`` accepts it (counted as a flip in the verdict; off by default: a flip is
one-in-millions luck, and a changed value that happens to look like one would pass). ``same ... max rel 3e-16``
says how far apart the accepted floats were.

Layout of a recorded set: ``DIR/manifest.json`` (what, seed, code, its commit); per config or
scenario ``DIR/NAME/status.txt`` (``ok`` or ``exit N: last line``) and ``DIR/NAME/out/LABEL/
FILE`` (LABEL: the run's index, a sweep point's name); a scenario's inputs beside them.

``--added NAMES`` (comma-separated ``fnmatch`` patterns, e.g. ``itl_*``) names what the
compared tree writes and the reference does not: object keys matching one (in results.json,
wherever they are, and in the JSONL files), string list entries matching one (results.json's
column lists) and results.txt summary lines ``NAME: ...`` are dropped from both sides before
comparing, so that a change that adds outputs shows everything else the same.

Exit 0 when everything compared is the same, 1 when something differs or fails.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = (
    "ticks.jsonl",
    "requests.jsonl",
    "timeline.jsonl",
    "growth.jsonl",
    "instances.jsonl",
    "trace.json",
)
TIMED_KINDS = ("alloc_host", "alloc_l1")
COMMANDS = {
    "admit": ["admit"],
    "alloc_host": ["alloc", "host"],
    "alloc_l1": ["alloc", "l1"],
    "trace_stats": ["trace", "stats"],
    "trace_curve": ["trace", "curve"],
}
ILLEGAL = 2  # cpkv's exit status for a config it refuses
FLOAT = re.compile(
    r"(?<![\w.])[-+]?(?:\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)(?![\w.])|\b(?:nan|inf|NaN|Infinity)\b"
)


@dataclass
class Item:
    """One thing to run: a config under configs/ or a random scenario (its folder)."""

    name: str
    args: list[str]
    sweep: bool = False
    folder: Path | None = None
    about: str = ""


@dataclass
class Outcome:
    """What one tree did with an item: ``ok`` or why not, and the comparable files."""

    status: str
    seconds: float = 0.0
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def illegal(self) -> bool:
        return self.status.startswith(f"exit {ILLEGAL}:")

    @property
    def too_slow(self) -> bool:
        return self.status.startswith("took longer")


# --- running cpkv ------------------------------------------------------------------------


def read_kind(config: Path) -> tuple[str, bool]:
    """(kind, has a sweep block) of a config file, read without cpkv."""
    import yaml

    doc = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    return str(doc.get("kind", "admit")), isinstance(doc.get("sweep"), dict)


def config_items(only: list[str]) -> list[Item]:
    found = sorted(  # (configs/validation holds `cpkv validate`'s cases, not runs)
        p for p in (ROOT / "configs").rglob("*.yaml") if "validation" not in p.parts
    )
    items = []
    for path in (p.relative_to(ROOT) for p in found):
        if only and not any(o in str(path) for o in only):
            continue
        kind, is_sweep = read_kind(ROOT / path)
        args = ["sweep", str(path)] if is_sweep else [*COMMANDS[kind], str(path)]
        items.append(Item(str(path), args, is_sweep))
    return items


def run_cpkv(code_root: Path, args: list[str], out: Path, limit: float) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONPATH": str(code_root), "CPKV_PLOTS": "0", "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-P", "-m", "cpkv", *args, "-o", str(out)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit, check=False
        )
    except subprocess.TimeoutExpired:
        return -1, time.perf_counter() - start, f"took longer than {limit:.0f} s"
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
    return proc.returncode, time.perf_counter() - start, tail[0]


def strip_timing(results: dict) -> dict:
    columns = results.get("columns", {})
    timing = set(columns.get("timing", ())) | set(columns.get("samples", ()))  # raw samples too
    results["rows"] = [{k: v for k, v in row.items() if k not in timing} for row in results["rows"]]
    summary = results.get("summary", {})
    for key in wall_clock_keys(summary):
        del summary[key]
    results["notes"] = [n for n in results.get("notes", []) if not n.startswith("timing:")]
    if results.get("kind") in TIMED_KINDS:
        results["notes"] = []
        summary.pop("headline", None)  # geometric means of timings
        for key in [k for k in summary if k.startswith("vs_")]:
            del summary[key]
    return results


def wall_clock_keys(summary: dict) -> list[str]:
    """Summary keys that hold wall-clock measurements: ``timing`` and every ``*_us``."""
    return [k for k in summary if k == "timing" or k.endswith("_us")]


def without_wall_clock(obj):
    """``obj`` without the keys that end in ``_us`` (wall-clock times of admission ticks)."""
    if isinstance(obj, dict):
        return {k: without_wall_clock(v) for k, v in obj.items() if not k.endswith("_us")}
    if isinstance(obj, list):
        return [without_wall_clock(v) for v in obj]
    return obj


def golden_files(run_dir: Path) -> dict[str, bytes]:
    """The comparable content of one run directory, by file name."""
    out: dict[str, bytes] = {}
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    kind = results.get("kind")
    summary_keys = wall_clock_keys(results.get("summary", {}))
    out["results.json"] = json.dumps(strip_timing(results), indent=1, sort_keys=True).encode()
    if kind not in TIMED_KINDS:
        skip = tuple(f"{k}:".encode() for k in summary_keys)
        lines = (run_dir / "results.txt").read_bytes().splitlines(keepends=True)
        out["results.txt"] = b"".join(
            ln for ln in lines if not ln.startswith((b"note: timing:", *skip))
        )
    for name in OUTPUTS:
        if (run_dir / name).exists():
            data = (run_dir / name).read_bytes()
            if name == "ticks.jsonl":
                data = b"".join(
                    json.dumps(without_wall_clock(json.loads(line)), separators=(",", ":")).encode()
                    + b"\n"
                    for line in data.splitlines()
                )
            out[name] = data
    return out


def without_added(files: dict[str, bytes], patterns: list[str]) -> dict[str, bytes]:
    """``files`` without what ``patterns`` name (``--added``; module docstring)."""
    if not patterns:
        return files

    def named(key: object) -> bool:
        return isinstance(key, str) and any(fnmatch.fnmatchcase(key, p) for p in patterns)

    def drop(obj):
        if isinstance(obj, dict):
            return {k: drop(v) for k, v in obj.items() if not named(k)}
        if isinstance(obj, list):
            return [drop(v) for v in obj if not named(v)]
        return obj

    out = {}
    for name, data in files.items():
        if name.endswith("results.json"):
            data = json.dumps(drop(json.loads(data)), indent=1, sort_keys=True).encode()
        elif name.endswith(".jsonl"):
            lines = data.decode().splitlines()
            data = "".join(json.dumps(drop(json.loads(ln))) + "\n" for ln in lines).encode()
        elif name.endswith("results.txt"):
            data = b"".join(
                ln for ln in data.splitlines(keepends=True)
                if not named(ln.split(b":", 1)[0].decode(errors="replace"))
            )  # fmt: skip
        out[name] = data
    return out


def run_dirs(out: Path) -> list[Path]:
    """Run directories under ``out``, in a stable order (sweep points by name, runs by time)."""
    return sorted(p.parent for p in out.rglob("results.json"))


def collect(code_root: Path, item: Item, limit: float, dest: Path) -> Outcome:
    """Run one item with one code tree and read back what it wrote."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    rc, seconds, tail = run_cpkv(code_root, item.args, dest, limit)
    if rc != 0:
        return Outcome(tail if rc < 0 else f"exit {rc}: {tail}", seconds)
    files: dict[str, bytes] = {}
    for i, run in enumerate(run_dirs(dest)):
        label = run.name.split("_", 1)[0] if item.sweep else str(i)
        for name, data in golden_files(run).items():
            files[f"{label}/{name}"] = data
    return Outcome("ok", seconds, files)


def base_worktree(rev: str, where: Path) -> Path:
    tree = where / "base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
        check=True,
        capture_output=True,
    )
    return tree


def commit_of(tree: Path) -> str:
    proc = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--", "cpkv"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() + (" (cpkv/ modified)" if dirty.stdout.strip() else "")


# --- recorded sets -----------------------------------------------------------------------


def slug(name: str) -> str:
    return name.replace("/", "__")


def save(item: Item, outcome: Outcome, target: Path) -> None:
    folder = target / slug(item.name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "status.txt").write_text(outcome.status + "\n", encoding="utf-8")
    for key, data in outcome.files.items():
        path = folder / "out" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def load(item: Item, source: Path) -> Outcome | None:
    folder = source / slug(item.name)
    if not (folder / "status.txt").exists():
        return None
    out = folder / "out"
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    return Outcome((folder / "status.txt").read_text(encoding="utf-8").strip(), 0.0, files)


def write_manifest(target: Path, what: str, args: argparse.Namespace) -> None:
    info = {
        "what": what,
        "seed": args.seed if what == "random" else None,
        "count": args.random,
        "code": str(args.code),
        "commit": commit_of(args.code),
        "limit_s": args.limit,
        "python": sys.version.split()[0],
        "recorded": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (target / "manifest.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")


def recorded_what(source: Path) -> str:
    manifest = source / "manifest.json"
    if not manifest.exists():
        return "configs"
    return json.loads(manifest.read_text(encoding="utf-8"))["what"]


# --- comparison --------------------------------------------------------------------------


@dataclass
class Tolerance:
    """The float rule (module docstring) and what it accepted."""

    rel: float
    floor: float
    last_digit: bool = False
    worst: float = 0.0  # the largest relative difference accepted
    flips: int = 0  # differences accepted as one unit in the last printed digit

    def close(self, a: float, b: float) -> bool:
        if a == b or (a != a and b != b):  # NaN == NaN here
            return True
        diff, scale = abs(a - b), max(abs(a), abs(b))
        if diff <= max(self.rel * scale, self.floor):
            self.worst = max(self.worst, diff / scale)
            return True
        if self.last_digit and last_digit_apart(a, b):
            self.flips += 1
            return True
        return False


def decimals(x: float) -> int | None:
    text = repr(float(x))
    return None if "e" in text or "." not in text else len(text.split(".")[1])


def last_digit_apart(a: float, b: float) -> bool:
    """Whether ``a`` and ``b`` are one unit apart in the last digit either prints, at 3
    decimals or more (the outputs' rounded floats have 3 to 6; ``repr`` drops trailing zeros,
    so 7.5 may be 7.5000: 7.5 vs 7.6 is not a flip, 7.5 vs 7.4999 is)."""
    places = [d for d in (decimals(a), decimals(b)) if d is not None]
    return bool(places) and max(places) >= 3 and abs(a - b) <= 10.0 ** -max(places) * (1 + 1e-6)


def masked(text: str) -> str:
    """``text`` with every float literal replaced by ``#``, blanks and table rules collapsed."""
    text = FLOAT.sub("#", text)
    return re.sub(r"-{2,}", "--", re.sub(r"\s+", " ", text)).strip()


def is_number(x: object) -> bool:
    return type(x) in (int, float)


def shown(x: object) -> str:
    text = json.dumps(x) if not isinstance(x, float) else repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def apart(a: str, b: str) -> tuple[str, str]:
    """The two strings from a little before their first difference."""
    pairs = enumerate(zip(a, b, strict=False))
    at = next((i for i, (p, q) in pairs if p != q), min(len(a), len(b)))
    start = max(0, at - 30)
    dots = "..." if start else ""
    return dots + a[start : at + 50], dots + b[start : at + 50]


def number_difference(a: float, b: float, path: str) -> str:
    rel = abs(a - b) / max(abs(a), abs(b))
    flip = " (one unit in the last printed digit)" if last_digit_apart(a, b) else ""
    return f"{path}: {a!r} vs {b!r} (rel {rel:.1e}){flip}"


def first_difference(a, b, tol: Tolerance, text=str, path: str = "") -> str | None:
    """The path and values of the first difference between two parsed JSON values, or None."""
    where = path or "(top)"
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            gone, new = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
            return f"{where}: keys missing now {gone}, new {new}"
        for key in a:
            found = first_difference(a[key], b[key], tol, text, f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} entries"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, tol, text, f"{path}[{i}]")
            if found:
                return found
        return None
    if is_number(a) and is_number(b) and float in (type(a), type(b)):
        return None if tol.close(a, b) else number_difference(a, b, where)
    if isinstance(a, str) and isinstance(b, str):
        x, y = text(a), text(b)
        return None if x == y else "{}: {!r} vs {!r}".format(where, *apart(x, y))
    if type(a) is type(b) and a == b:
        return None
    return f"{where}: {shown(a)} vs {shown(b)}"


def compare_json(name: str, a: bytes, b: bytes, tol: Tolerance) -> str | None:
    try:
        x, y = json.loads(a), json.loads(b)
    except ValueError as err:
        return f"{name}: not JSON ({err})"
    text = masked if name.endswith("results.json") else str
    found = first_difference(x, y, tol, text)
    return None if found is None else f"{name}: {found}"


def compare_jsonl(name: str, a: bytes, b: bytes, tol: Tolerance) -> str | None:
    la, lb = a.decode().splitlines(), b.decode().splitlines()
    first, count = None, 0
    for i, (x, y) in enumerate(zip(la, lb, strict=False), 1):
        found = None if x == y else first_difference(json.loads(x), json.loads(y), tol)
        if found:
            count += 1
            first = first or f"{name}:{i}: {found}"
    if len(la) != len(lb):
        return f"{name}: {len(la)} vs {len(lb)} lines" + (f"; first: {first}" if first else "")
    return None if first is None else f"{first} ({count} of {len(la)} lines differ)"


def compare_text(name: str, a: bytes, b: bytes) -> str | None:
    la = [masked(s) for s in a.decode().splitlines() if s.strip()]
    lb = [masked(s) for s in b.decode().splitlines() if s.strip()]
    for i, (x, y) in enumerate(zip(la, lb, strict=False), 1):
        if x != y:
            x, y = apart(x, y)
            return f"{name}: line {i} differs beyond float literals: {x!r} vs {y!r}"
    return None if len(la) == len(lb) else f"{name}: {len(la)} vs {len(lb)} text lines"


def compare_bytes(name: str, a: bytes, b: bytes) -> str:
    x, y = a.splitlines(), b.splitlines()
    line = next(
        (i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y))
    )
    return f"{name}: differs from line {line + 1}"


def compare_file(name: str, a: bytes, b: bytes, tol: Tolerance | None) -> str | None:
    if a == b:
        return None
    if tol is None:
        return compare_bytes(name, a, b)
    if name.endswith(".jsonl"):
        return compare_jsonl(name, a, b, tol)
    if name.endswith(".json"):
        return compare_json(name, a, b, tol)
    if name.endswith("results.txt"):
        return compare_text(name, a, b)
    return compare_bytes(name, a, b)


def is_serving(results: bytes | None) -> bool:
    if results is None:
        return False
    summary = json.loads(results).get("summary", {})
    return isinstance(summary, dict) and summary.get("mode") == "serving"


def compare(base: dict[str, bytes], head: dict[str, bytes], tol: Tolerance | None) -> list[str]:
    """One line per file that differs (the first difference in it)."""
    problems = []
    for key in sorted(set(base) | set(head)):
        if key not in head:
            problems.append(f"{key}: missing now")
        elif key not in base:
            problems.append(f"{key}: new (not in the base)")
        else:
            label = key.rsplit("/", 1)[0]
            tolerant = tol is not None and is_serving(base.get(f"{label}/results.json"))
            problem = compare_file(key, base[key], head[key], tol if tolerant else None)
            if problem:
                problems.append(problem)
    return problems


# --- random serving scenarios ------------------------------------------------------------

POLICY_CYCLE = (
    "prefill_adder",
    "conservative",
    "prefill_adder",
    "optimistic",
    "iteration",
    "profiled",
)
"""Scenario ``i`` runs ``POLICY_CYCLE[i % 6]``: prefill_adder twice, as SGLang's orders,
priorities and adaptive ratio apply to it alone."""
SGLANG_ORDERS = ("lof", "random", "lpm", "dfs-weight", "hrrn", "shortest-prefill-first")
CACHE_AWARE = ("lpm", "dfs-weight", "hrrn", "shortest-prefill-first")
VICTIMS = ("scan_order", "newest_first", "largest_first", "least_progress")
ROUTERS = (
    "round_robin",
    "random",
    "least_requests",
    "least_tokens",
    "prefix_aware",
    "power_of_two",
)
MODELS = ("llama-3-8b", "llama-2-7b", "llama-2-70b", "llama-3-70b", "qwen-72b", "codellama-34b")
MOONCAKE = "../shared/data/mooncake_synthetic_trace.jsonl"
AZURE = ("../shared/data/azure_llm_2023/conversation.csv", "../shared/data/azure_llm_2023/code.csv")
FIT_POINTS = "configs/examples/points.jsonl"
MAX_ITERATIONS = 20000


def maybe(rng: random.Random, p: float, value):
    """``value`` (called when callable) with probability ``p``, else None."""
    if rng.random() >= p:
        return None
    return value() if callable(value) else value


def put(block: dict, key: str, value) -> None:
    """Set ``block[key]`` unless ``value`` is None (a key left to its default)."""
    if value is not None:
        block[key] = value


@functools.lru_cache(maxsize=4)
def trace_sizes(path: str) -> tuple[tuple[int, int], ...]:
    """(prompt, output) tokens of each request of a Mooncake JSONL or Azure CSV trace."""
    text = (ROOT / path).read_text(encoding="utf-8")
    if path.endswith(".csv"):
        rows = [line.split(",") for line in text.splitlines()[1:] if line.strip()]
        return tuple((int(r[1]), int(r[2])) for r in rows)
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return tuple((r["input_length"], r["output_length"]) for r in rows)


def pick_order(rng: random.Random, policy: str) -> dict:
    """The waiting-queue keys: SGLang's orders (prefill_adder only), priorities, deadline."""
    block: dict = {}
    r = rng.random()
    if r < 0.2:
        block["schedule_policy"] = "deadline"
        put(block, "deadline", maybe(rng, 0.5, lambda: {"aging_ms": rng.choice([50.0, 1e3, 6e4])}))
    elif policy == "prefill_adder" and r < 0.7:
        block["schedule_policy"] = rng.choice(SGLANG_ORDERS)
    order = block.get("schedule_policy", "fcfs")
    if policy == "prefill_adder" and order in ("fcfs", "lof") and rng.random() < 0.45:
        block["enable_priority_scheduling"] = True
        put(block, "schedule_low_priority_values_first", maybe(rng, 0.4, True))
        put(block, "priority_scheduling_preemption_threshold", maybe(rng, 0.5, rng.choice([0, 3])))
        put(block, "disable_priority_preemption", maybe(rng, 0.25, True))
    if order in CACHE_AWARE and rng.random() < 0.3:
        block["in_batch_prefix_check_threshold"] = rng.choice([-1, 0, 32, 4096])
        block["in_batch_prefix_deprioritize_threshold"] = rng.choice([-1, 16, 32, 1024])
    return block


def pick_budgets(rng: random.Random) -> dict:
    """SGLang's PrefillAdder budgets (read by prefill_adder; some by the others too)."""
    block: dict = {}
    put(block, "max_prefill_tokens", maybe(rng, 0.5, rng.choice([16384, 4096, 1024, 256, 64])))
    put(block, "chunked_prefill_size", maybe(rng, 0.6, rng.choice([8192, 2048, 512, 64, -1])))
    put(block, "new_token_ratio", maybe(rng, 0.3, rng.choice([0.0, 0.3, 1.0])))
    put(block, "max_running_requests", maybe(rng, 0.3, rng.choice([1, 2, 8, 32])))
    put(block, "prefill_max_requests", maybe(rng, 0.2, rng.choice([1, 4])))
    put(block, "load_back_threshold", maybe(rng, 0.2, rng.choice([0, 100, 100000])))
    put(block, "max_new_tokens", maybe(rng, 0.4, rng.choice([0, 1, 16, 512])))
    r = rng.random()
    if r < 0.5:
        block["cp"] = {"enabled": False}
    elif r < 0.75:
        block["cp"] = {
            "enabled": True,
            "max_batch_requests": rng.choice([None, 2, 8]),
            "max_total_extend_tokens": rng.choice([None, 4096, 65536]),
            "max_total_cached_tokens": rng.choice([None, 8192]),
        }
    return block


def arrival_times(rng: random.Random, n: int) -> list[float]:
    """Arrivals in ms: all at 0, spread, in bursts, or Poisson-like gaps (maybe unsorted)."""
    shape = rng.choice(("zero", "spread", "bursts", "gaps"))
    if shape == "zero":
        return [0.0] * n
    if shape == "spread":
        span = rng.choice([10.0, 1000.0, 20000.0])
        times = [rng.uniform(0, span) for _ in range(n)]
    elif shape == "bursts":
        starts = [rng.uniform(0, 10000.0) for _ in range(rng.randint(1, 5))]
        times = [rng.choice(starts) for _ in range(n)]
    else:
        mean, t, times = rng.choice([1.0, 50.0, 500.0]), 0.0, []
        for _ in range(n):
            t += rng.expovariate(1 / mean)
            times.append(t)
    times = [round(t, rng.choice([0, 3])) for t in times]
    return times if rng.random() < 0.2 else sorted(times)


def prompt_tokens(rng: random.Random, profile: str) -> int:
    if profile == "huge" and rng.random() < 0.08:
        return rng.randint(30000, 120000)
    low, high = {"short": (1, 64), "mixed": (1, 4096), "long": (1024, 16384)}.get(
        profile, (1, 4096)
    )
    return rng.randint(low, high)


def new_tokens(rng: random.Random, long_decode: bool) -> int | None:
    if long_decode:
        return rng.randint(200, 3000)
    r = rng.random()
    for bound, value in ((0.05, 0), (0.15, 1), (0.25, None), (0.3, rng.randint(513, 2048))):
        if r < bound:
            return value
    return rng.randint(2, 32) if r < 0.65 else rng.randint(33, 512)


def request_line(rng: random.Random, i: int, arrival: float, shape: dict) -> dict:
    line: dict = {"rid": f"q{i}", "extend_tokens": prompt_tokens(rng, shape["profile"])}
    if shape["hits"] and rng.random() < 0.6:
        line["l1_cached_tokens"] = rng.choice([0, 16, 512, 4096, rng.randint(1, 20000)])
        line["l2_cached_tokens"] = rng.choice([0, 0, 9, 512, rng.randint(1, 30000)])
    put(line, "max_new_tokens", new_tokens(rng, shape["long_decode"]))
    if arrival:
        line["arrival_ms"] = arrival
    if shape["priorities"]:
        line["priority"] = rng.randint(-5, 25)
    if rng.random() < shape["cancel"]:
        line["cancel_ms"] = round(rng.uniform(0, 3000), 3)
    if rng.random() < shape["deadline"]:
        line["deadline_ms"] = round(rng.choice([10.0, 200.0, rng.uniform(0, 5000)]), 3)
    return line


def jsonl_workload(rng: random.Random, block: dict, default_new: int) -> tuple[list, list]:
    """Prefill-model lines (rid, hits, extend, max_new, arrival, priority, cancel, deadline)."""
    long_decode = rng.random() < 0.12
    n = (
        rng.randint(5, 12)
        if long_decode
        else rng.choice([rng.randint(5, 30), rng.randint(30, 300)])
    )
    shape = {
        "profile": rng.choice(("short", "mixed", "mixed", "long", "huge")),
        "hits": rng.random() < 0.5,
        "long_decode": long_decode,
        "priorities": block.get("enable_priority_scheduling", False) or rng.random() < 0.1,
        "cancel": rng.choice([0.0, 0.0, 0.0, 0.2, 0.6]),
        "deadline": rng.choice([0.0, 0.5]) if block.get("schedule_policy") == "deadline" else 0.0,
    }
    times = arrival_times(rng, n)
    lines = [request_line(rng, i, t, shape) for i, t in enumerate(times)]
    sizes = [
        line["extend_tokens"]
        + line.get("l1_cached_tokens", 0)
        + line.get("l2_cached_tokens", 0)
        + line.get("max_new_tokens", default_new)
        for line in lines
    ]
    return lines, sizes


def block_workload(rng: random.Random, default_new: int) -> tuple[list, list]:
    """Block lines (rid, prompt_tokens, max_new_tokens): no hits, arrival 0."""
    lines = []
    for i in range(rng.randint(5, 120)):
        line: dict = {"rid": f"b{i}", "prompt_tokens": rng.choice([0, 1, rng.randint(1, 8192)])}
        put(line, "max_new_tokens", maybe(rng, 0.8, lambda: rng.randint(0, 600)))
        lines.append(line)
    return lines, [ln["prompt_tokens"] + ln.get("max_new_tokens", default_new) for ln in lines]


def trace_cache(rng: random.Random) -> dict:
    l1, l2 = rng.choice([(1048576, 8388608), (65536, 0), (16384, 262144), (4096, None)])
    cache = {"l1_tokens": l1, "l2_tokens": l2}
    put(cache, "page_size", maybe(rng, 0.2, rng.choice([16, 64])))
    return cache


def trace_workload(rng: random.Random) -> tuple[dict, list]:
    """A slice of the Mooncake trace (prefix hashes) or of an Azure trace (maybe shared)."""
    mooncake = rng.random() < 0.75
    path = MOONCAKE if mooncake else rng.choice(AZURE)
    sizes = trace_sizes(path)
    limit = rng.choice([rng.randint(5, 30), rng.randint(30, 150)])
    start = rng.randint(0, len(sizes) - limit)
    spec: dict = {"source": "trace", "path": path, "start": start, "limit": limit}
    if mooncake:
        spec.update(format="mooncake", block_size=512)
    else:
        spec.update(format="azure_csv", block_size=rng.choice([16, 512]))
        put(spec, "prefix", maybe(rng, 0.5, lambda: azure_prefix(rng)))
    spec["cache"] = trace_cache(rng)
    put(spec, "repeat", maybe(rng, 0.15, rng.choice([2, 3])))
    return spec, [p + o for p, o in sizes[start : start + limit]] * spec.get("repeat", 1)


def azure_prefix(rng: random.Random) -> dict:
    return {
        "model": "shared",
        "groups": rng.choice([1, 4, 16]),
        "tokens": rng.choice([256, 1024, 4096]),
        "fraction": rng.choice([0.5, 1.0]),
        "zipf": rng.choice([0.0, 1.2]),
        "seed": rng.randint(0, 9),
    }


def synthetic_workload(rng: random.Random, default_new: int) -> tuple[dict, list]:
    """The seeded synthetic source, drawn lazily by the loop."""
    high = rng.choice([64, 2048, 8192])
    new = maybe(rng, 0.6, lambda: {"low": 0, "high": rng.choice([1, 64, 512])})
    synthetic: dict = {
        "count": rng.randint(5, 300),
        "seed": rng.choice([None, rng.randint(0, 99)]),
        "l1_cached_tokens": {"low": 1, "high": high, "zero_fraction": 0.5},
        "l2_cached_tokens": {"low": 1, "high": high, "zero_fraction": 0.7},
        "extend_tokens": {"low": 1, "high": high},
    }
    put(synthetic, "max_new_tokens", new)
    largest = 3 * high + (new["high"] if new else default_new)
    return {"source": "synthetic", "synthetic": synthetic}, [largest] * synthetic["count"]


def pick_workload(rng: random.Random, block: dict) -> tuple[dict, list | None, list]:
    """(the workload block, the JSONL lines or None, each request's tokens, at most)."""
    default_new = block.get("max_new_tokens", 128)
    r = rng.random()
    if r < 0.6:
        lines, sizes = jsonl_workload(rng, block, default_new)
    elif r < 0.68:
        lines, sizes = block_workload(rng, default_new)
    elif r < 0.94:
        spec, sizes = trace_workload(rng)
        return spec, None, sizes
    else:
        spec, sizes = synthetic_workload(rng, default_new)
        return spec, None, sizes
    return {"source": "jsonl", "path": "workload.jsonl"}, lines, sizes


def bound_work(block: dict, total_tokens: int) -> None:
    """Raise the per-iteration token budgets so that the prompts take at most about
    :data:`MAX_ITERATIONS` iterations (a scenario stays well under a second)."""
    least = -(-total_tokens // MAX_ITERATIONS)
    for keys in (
        ("max_prefill_tokens",),
        ("chunked_prefill_size",),
        ("iteration", "budget_tokens"),
        ("iteration", "chunk_tokens"),
    ):
        holder = block.get(keys[0]) if len(keys) > 1 else block
        value = holder.get(keys[-1]) if isinstance(holder, dict) else None
        if isinstance(value, int) and 0 < value < least:
            holder[keys[-1]] = least


def pick_kv(rng: random.Random, largest: int) -> dict:
    """A pool from much too small (the largest request never fits) to roomy."""
    block_size = rng.choice([1, 4, 16, 16, 32, 64])
    pressure = rng.choice([0.6, 1.0, 1.3, 2.0, 4.0, 50.0])
    capacity = max(1, int(largest * pressure + rng.randint(0, block_size)) // block_size)
    kv = {"block_size": block_size, "capacity_blocks": capacity, "victim": rng.choice(VICTIMS)}
    put(kv, "scan", maybe(rng, 0.5, rng.choice([None, "first_fit", "fcfs_stop"])))
    put(kv, "safety_margin_blocks", maybe(rng, 0.15, lambda: rng.randint(1, max(1, capacity // 4))))
    return kv


def pick_iteration(rng: random.Random) -> dict:
    """The iteration budget of conservative, optimistic, iteration and profiled."""
    it: dict = {
        "budget_tokens": rng.choice([8192, 2048, 512, 64, 17, 3]),
        "chunk_tokens": rng.choice([8192, 1024, 256, 16, 1]),
    }
    put(
        it,
        "weights",
        maybe(
            rng,
            0.2,
            lambda: {
                "prefill": rng.choice([1.0, 0.5, 2.0]),
                "decode": rng.choice([1.0, 0.0, 3.0]),
                "verify": rng.choice([1.0, 2.0]),
            },
        ),
    )
    put(it, "verify_tokens", maybe(rng, 0.15, rng.choice([1, 3])))
    return it


def pick_profiled(rng: random.Random) -> dict:
    return {
        "quantile": rng.choice([0.0, 0.5, 0.9, 1.0]),
        "window": rng.choice([1, 10, 1000]),
        "cold_start_tokens": rng.choice([None, 0, 64]),
    }


def pick_serving(rng: random.Random, policy: str) -> dict:
    """``admit.serving``: preemption, timeouts, graphs, invariants, metrics, trace events."""
    r = rng.random()
    s: dict = {"on_preempt": "requeue" if r < 0.5 else "swap" if r < 0.75 else "abort"}
    put(s, "queue_timeout_ms", maybe(rng, 0.2, rng.choice([50.0, 500.0, 3000.0])))
    buckets = sorted(rng.sample([1, 2, 4, 8, 16, 32, 64, 128], rng.randint(1, 5)))
    put(s, "cuda_graph_buckets", maybe(rng, 0.2, buckets))
    put(s, "check_invariants", maybe(rng, 0.1, True))
    put(s, "policy_metrics", maybe(rng, 0.2, True))
    put(s, "timeline_points", maybe(rng, 0.3, rng.choice([1, 7, 50, 1000])))
    if policy == "prefill_adder" and rng.random() < 0.2:
        s["ratio_min_factor"] = rng.choice([0.0, 0.5])
        s["ratio_decay_steps"] = rng.choice([1, 50])
    put(s, "trace_events", maybe(rng, 0.15, True))
    put(s, "stall_iterations", maybe(rng, 0.03, rng.choice([3, 20])))
    return s


def pick_cost(rng: random.Random) -> dict:
    """Linear coefficients (maybe fitted to the example points) or a roofline model."""
    if rng.random() < 0.35:
        cost: dict = {"kind": "linear"}
        put(cost, "fixed_us", maybe(rng, 0.5, rng.choice([0.0, 500.0, 5000.0])))
        put(cost, "prefill_token_us", maybe(rng, 0.5, rng.choice([1.0, 30.0, 100.0])))
        put(cost, "decode_request_us", maybe(rng, 0.5, rng.choice([0.0, 30.0, 300.0])))
        put(cost, "context_token_us", maybe(rng, 0.5, rng.choice([0.0, 0.04, 1.0])))
        put(cost, "kv_bytes_per_token", maybe(rng, 0.3, rng.choice([32768, 327680])))
        put(cost, "l2_load_gb_per_s", maybe(rng, 0.3, rng.choice([None, 5.0])))
        put(cost, "fit_points", maybe(rng, 0.1, FIT_POINTS))
        return cost
    cost = {"kind": "roofline"}
    put(cost, "model", maybe(rng, 0.4, rng.choice(MODELS)))
    put(cost, "gpu", maybe(rng, 0.4, "a100-80gb"))
    put(cost, "tp", maybe(rng, 0.3, rng.choice([2, 4, 8])))
    put(cost, "calibration", maybe(rng, 0.15, {"overhead_us": rng.choice([0.0, 100.0])}))
    return cost


def pick_arrivals(rng: random.Random) -> dict:
    r = rng.random()
    if r < 0.7:
        return {"process": "trace", "speedup": rng.choice([1.0, 1.0, 0.5, 2.0, 10.0])}
    if r < 0.85:
        return {"process": "poisson", "rate_rps": rng.choice([0.5, 5.0, 50.0, 1000.0])}
    return {"process": "zero"}


def pick_cluster(rng: random.Random) -> dict:
    cluster: dict = {"instances": rng.choice([2, 3]), "router": rng.choice(ROUTERS)}
    put(cluster, "shared_l2", maybe(rng, 0.3, True))
    if cluster["router"] == "prefix_aware" and rng.random() < 0.5:
        cluster["cache_threshold"] = rng.choice([0.0, 0.3, 0.9])
        cluster["balance_abs_threshold"] = rng.choice([0, 4, 64])
        cluster["balance_rel_threshold"] = rng.choice([1.0, 1.5, 4.0])
        cluster["max_tree_blocks"] = rng.choice([None, 16, 1000])
    return cluster


def keep_buckets_within(block: dict) -> None:
    """The CUDA-graph buckets drawn, but those larger than a batch can be (the maximum
    running requests, or the pool's blocks): cpkv refuses those; none left, none set."""
    serving = block["serving"]
    buckets = serving.get("cuda_graph_buckets")
    if not buckets:
        return
    largest = block.get("max_running_requests") or block["kv"]["capacity_blocks"]
    kept = [b for b in buckets if b <= largest]
    if kept:
        serving["cuda_graph_buckets"] = kept
    else:
        del serving["cuda_graph_buckets"]


def make_illegal(rng: random.Random, block: dict) -> None:
    """One combination cpkv refuses (exit 2), so that the skip path is exercised."""
    choice = rng.randrange(4)
    if choice == 0:
        block["schedule_policy"], block["enable_priority_scheduling"] = "lpm", True
    elif choice == 1:
        block["schedule_policy"] = "routing-key"
    elif choice == 2:
        block["kv"]["safety_margin_blocks"] = block["kv"]["capacity_blocks"]
    else:
        block["kv"]["scan"] = "all_or_error"


def scenario(seed: int, index: int) -> tuple[dict, list | None, str]:
    """Scenario ``index`` of ``seed``: (the config, the JSONL lines or None, a summary line).
    The policy cycles through :data:`POLICY_CYCLE`; everything else is drawn."""
    rng = random.Random(f"golden/{seed}/{index}")  # str seeds are hashed stably
    policy = POLICY_CYCLE[index % len(POLICY_CYCLE)]
    block: dict = {"policy": policy, "mode": "serving", **pick_order(rng, policy)}
    block.update(pick_budgets(rng))
    block["workload"], lines, sizes = pick_workload(rng, block)
    block["kv"] = pick_kv(rng, max(sizes))
    if policy != "prefill_adder":
        block["iteration"] = pick_iteration(rng)
    bound_work(block, sum(sizes))
    put(
        block,
        "profiled",
        maybe(rng, 0.6, lambda: pick_profiled(rng)) if policy == "profiled" else None,
    )
    block["serving"] = pick_serving(rng, policy)
    keep_buckets_within(block)
    block["cost"] = pick_cost(rng)
    block["arrivals"] = pick_arrivals(rng)
    put(block, "slo", maybe(rng, 0.6, lambda: slo(rng)))
    put(block, "cluster", maybe(rng, 0.25, lambda: pick_cluster(rng)))
    if rng.random() < 0.04:
        make_illegal(rng, block)
    config = {"kind": "admit", "name": f"golden-s{index:04d}", "seed": rng.randint(0, 99)}
    config["admit"] = block
    return config, lines, about(block, lines)


def slo(rng: random.Random) -> dict:
    return {
        "ttft_ms": rng.choice([50.0, 1000.0, 10000.0]),
        "tpot_ms": rng.choice([None, 10.0, 200.0]),
    }


def about(block: dict, lines: list | None) -> str:
    """One line: policy, order, preemption, workload, pool, cost, instances."""
    w = block["workload"]
    count = (
        len(lines)
        if lines is not None
        else w["synthetic"]["count"]
        if w["source"] == "synthetic"
        else w["limit"] * w.get("repeat", 1)
    )
    source = Path(w["path"]).stem if w["source"] == "trace" else w["source"]
    kv = block["kv"]
    parts = [
        block["policy"],
        block.get("schedule_policy", "fcfs")
        + ("+prio" if "enable_priority_scheduling" in block else ""),
        block["serving"]["on_preempt"],
        f"{source}:{count}",
        f"kv {kv['capacity_blocks']}x{kv['block_size']}",
        block["cost"]["kind"],
    ]
    if "cluster" in block:
        parts.append(f"{block['cluster']['instances']}x{block['cluster']['router']}")
    return " ".join(parts)


def write_scenario(folder: Path, config: dict, lines: list | None, summary: str) -> None:
    import yaml

    folder.mkdir(parents=True)
    text = f"# {summary}\n" + yaml.safe_dump(config, sort_keys=False)
    (folder / "scenario.yaml").write_text(text, encoding="utf-8")
    if lines is not None:
        body = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        (folder / "workload.jsonl").write_text(body, encoding="utf-8")


def scenario_item(folder: Path) -> Item:
    config = folder / "scenario.yaml"
    summary = config.read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
    args = ["admit", str(config)]
    if (folder / "workload.jsonl").exists():
        args.append(f"admit.workload.path={folder / 'workload.jsonl'}")
    return Item(folder.name, args, folder=folder, about=summary)


def random_items(seed: int, count: int, where: Path) -> list[Item]:
    """Draw ``count`` scenarios into ``where``/sNNNN (their files) and list them."""
    items = []
    for index in range(count):
        config, lines, summary = scenario(seed, index)
        write_scenario(where / f"s{index:04d}", config, lines, summary)
        items.append(scenario_item(where / f"s{index:04d}"))
    return items


def recorded_items(source: Path) -> list[Item]:
    return [scenario_item(p.parent) for p in sorted(source.glob("s*/scenario.yaml"))]


# --- the two modes -----------------------------------------------------------------------


def label(item: Item) -> str:
    return f"{item.name} [{item.about}]" if item.about else item.name


def record_one(item: Item, args: argparse.Namespace, tmp: Path) -> str:
    """Run the item with ``--code`` and keep its outputs (or its refusal) in ``--record``."""
    out = collect(args.code, item, args.limit, tmp / "b")
    if out.too_slow or (item.folder is None and out.status != "ok"):
        print(f"skip  {label(item)}: {out.status} ({out.seconds:.1f} s)", flush=True)
        if item.folder is not None:
            shutil.rmtree(item.folder)
        return "skipped"
    save(item, out, args.record)
    verdict = "recorded" if out.status == "ok" else "refused" if out.illegal else "failing"
    what = f"{len(out.files)} files" if out.status == "ok" else out.status
    print(f"rec   {label(item)}: {what} ({out.seconds:.1f} s)", flush=True)
    return verdict


def reference(item: Item, args: argparse.Namespace, base_root: Path | None, tmp: Path):
    """The base's outcome: run with the base tree, or read from ``--against``."""
    if base_root is not None:
        return collect(base_root, item, args.limit, tmp / "a")
    return load(item, args.against)


def check_one(item: Item, args: argparse.Namespace, base_root: Path | None, tmp: Path) -> str:
    """Compare the item's outcome with ``--code`` against the reference; print a verdict."""
    ref = reference(item, args, base_root, tmp)
    if ref is None or ref.too_slow or (item.folder is None and ref.status != "ok"):
        why = "not recorded" if ref is None else f"base {ref.status}"
        print(f"skip  {label(item)}: {why}", flush=True)
        return "skipped"
    head = collect(args.code, item, args.limit * 3, tmp / "b")
    if ref.status != "ok":
        return check_refusal(item, ref, head)
    if head.status != "ok":
        print(f"FAIL  {label(item)}: {head.status}", flush=True)
        return "fail"
    tol = None if args.bytes else Tolerance(args.tolerance, args.abs_floor, args.last_digit)
    added = [p for p in args.added.split(",") if p]
    problems = compare(without_added(ref.files, added), without_added(head.files, added), tol)
    extra = ""
    if tol is not None and tol.worst:
        extra += f", max rel {tol.worst:.0e}"
    if tol is not None and tol.flips:
        extra += f", {tol.flips} last-digit flips"
    verdict = "DIFF " if problems else "same "
    print(f"{verdict} {label(item)}: {len(head.files)} files ({head.seconds:.1f} s{extra})")
    for problem in problems[:10]:
        print(f"        {problem}")
    sys.stdout.flush()
    return "diff" if problems else "same"


def check_refusal(item: Item, ref: Outcome, head: Outcome) -> str:
    """A scenario the base refused: the other tree must refuse it the same way."""
    same = masked(ref.status) == masked(head.status)
    if same and ref.illegal:
        print(f"skip  {label(item)}: refused, both trees ({ref.status[:90]})", flush=True)
        return "refused"
    if same:
        print(f"same  {label(item)}: both {ref.status[:90]}", flush=True)
        return "same"
    x, y = apart(masked(ref.status), masked(head.status))
    print(f"DIFF  {label(item)}: base {ref.status[:60]}...", flush=True)
    print(f"        base: {x}\n        now:  {y}", flush=True)
    return "diff"


def choose_items(args: argparse.Namespace, tmp: Path) -> tuple[str, list[Item]]:
    if args.against is not None and recorded_what(args.against) == "random":
        items = recorded_items(args.against)
        items = items[: args.random] if args.random else items
        what = "random"
    elif args.random and args.against is None:
        where = args.record if args.record is not None else tmp / "scenarios"
        items, what = random_items(args.seed, args.random, where), "random"
    else:
        items, what = config_items(args.only), "configs"
    if args.only:
        items = [i for i in items if any(o in i.name for o in args.only)]
    return what, items


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--base", help="git revision whose code is the reference")
    how.add_argument("--record", type=Path, help="write the golden set of --code's tree to DIR")
    how.add_argument("--against", type=Path, help="compare --code's tree with a recorded set")
    parser.add_argument("--code", type=Path, default=ROOT, help="the tree whose code runs")
    parser.add_argument("--only", action="append", default=[], help="names containing this")
    parser.add_argument("--limit", type=float, default=30.0, help="seconds a run may take (30)")
    parser.add_argument("--random", type=int, default=0, metavar="N", help="N random scenarios")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random scenarios (0)")
    parser.add_argument("--tolerance", type=float, default=1e-9, help="relative, floats (1e-9)")
    parser.add_argument("--abs-floor", type=float, default=1e-9, help="absolute, floats (1e-9)")
    parser.add_argument("--last-digit", action="store_true", help="accept last-digit flips")
    parser.add_argument("--bytes", action="store_true", help="compare every file byte for byte")
    parser.add_argument(
        "--added", default="", metavar="NAMES", help="keys only the compared tree writes"
    )
    args = parser.parse_args()
    args.code = args.code.resolve()
    if args.record is not None:
        args.record = args.record.resolve()
        if args.record.exists() and any(args.record.iterdir()):
            parser.error(f"--record {args.record} is not empty: choose a new directory")
    return args


def main() -> int:
    args = parse_args()
    started = time.perf_counter()
    tally: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="cpkv-golden-") as tmp_name:
        tmp = Path(tmp_name)
        base_root = base_worktree(args.base, tmp) if args.base else None
        try:
            if args.record is not None:
                args.record.mkdir(parents=True, exist_ok=True)
            what, items = choose_items(args, tmp)
            for item in items:
                if args.record is not None:
                    tally[record_one(item, args, tmp)] += 1
                else:
                    tally[check_one(item, args, base_root, tmp)] += 1
            if args.record is not None:
                write_manifest(args.record, what, args)
        finally:
            if base_root is not None:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_root)],
                    check=False,
                    capture_output=True,
                )
    counts = ", ".join(f"{n} {k}" for k, n in sorted(tally.items()))
    bad = tally["diff"] + tally["fail"]
    verdict = "recorded" if args.record else "identical" if bad == 0 else f"{bad} differ or fail"
    print(f"{verdict}: {len(items)} {what} ({counts}) in {time.perf_counter() - started:.0f} s")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
