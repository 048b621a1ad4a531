"""Golden outputs: prove that a refactor or an optimisation did not change behaviour.

Runs every config under ``configs/`` (sweep configs as sweeps) with two versions of cpkv — the
code of a base commit, checked out into a temporary git worktree, and the working tree — and
compares what they wrote byte for byte, timing fields aside:

* ``results.json`` without the fields its ``columns.timing`` declares, without ``summary.timing``
  and the summary's ``*_us`` keys (wall-clock time), without the notes that start with ``timing:``; for the kinds whose rows are timings (the allocator
  benches) also without the summary's ``vs_*`` ratios and the notes (they quote measured ratios);
* ``results.txt`` (without the lines of those summary keys and the ``note: timing:`` line),
  except for the allocator benches;
* every per-kind extra: ``ticks.jsonl`` (without the ``*_us`` fields, the wall-clock time of each
  tick, as ``cpkv.admission.records`` declares), ``requests.jsonl``, ``timeline.jsonl``,
  ``growth.jsonl``.

Both versions read the *working tree's* config files and run from the repository root (so the
relative paths inside configs resolve the same way); each is imported from its own tree with
``python -P`` so that neither shadows the other. A config that takes longer than ``--limit``
seconds with the base code is left out of the golden set and listed as such.

    python benchmarks/golden.py --base HEAD~3            # compare the working tree against HEAD~3
    python benchmarks/golden.py --base main --only admit/  # configs whose path contains admit/
    python benchmarks/golden.py --record DIR             # only write the working tree's golden files
    python benchmarks/golden.py --against DIR            # compare the working tree with a recorded set

Exit 0 when every compared file is identical, 1 when one differs.
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
EXTRAS = ("ticks.jsonl", "requests.jsonl", "timeline.jsonl", "growth.jsonl")
TIMED_KINDS = ("alloc_host", "alloc_l1")
COMMANDS = {
    "admit": ["admit"],
    "alloc_host": ["alloc", "host"],
    "alloc_l1": ["alloc", "l1"],
    "trace_stats": ["trace", "stats"],
    "trace_curve": ["trace", "curve"],
}


def read_kind(config: Path) -> tuple[str, bool]:
    """(kind, has a sweep block) of a config file, read without cpkv."""
    import yaml

    doc = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    return str(doc.get("kind", "admit")), isinstance(doc.get("sweep"), dict)


def configs(only: list[str]) -> list[Path]:
    found = sorted((ROOT / "configs").rglob("*.yaml"))
    rel = [p.relative_to(ROOT) for p in found]
    return [p for p in rel if not only or any(o in str(p) for o in only)]


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
    for name in EXTRAS:
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


def run_dirs(out: Path) -> list[Path]:
    """Run directories under ``out``, in a stable order (sweep points by name, runs by time)."""
    return sorted(p.parent for p in out.rglob("results.json"))


def collect(code_root: Path, config: Path, limit: float, dest: Path) -> tuple[str, float, dict]:
    """Run one config with one code tree; (status, seconds, {key: bytes})."""
    kind, is_sweep = read_kind(ROOT / config)
    args = ["sweep", str(config)] if is_sweep else [*COMMANDS[kind], str(config)]
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    rc, seconds, tail = run_cpkv(code_root, args, dest, limit)
    if rc != 0:
        return f"exit {rc}: {tail}", seconds, {}
    files: dict[str, bytes] = {}
    for i, run in enumerate(run_dirs(dest)):
        label = run.name.split("_", 1)[0] if is_sweep else str(i)
        for name, data in golden_files(run).items():
            files[f"{label}/{name}"] = data
    return "ok", seconds, files


def write_set(files: dict[str, dict[str, bytes]], target: Path) -> None:
    for config, content in files.items():
        for key, data in content.items():
            path = target / config.replace("/", "__") / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def read_set(source: Path, config: Path) -> dict[str, bytes] | None:
    folder = source / str(config).replace("/", "__")
    if not folder.exists():
        return None
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def base_worktree(rev: str, where: Path) -> Path:
    tree = where / "base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
        check=True,
        capture_output=True,
    )
    return tree


def compare(base: dict[str, bytes], head: dict[str, bytes]) -> list[str]:
    problems = []
    for key in sorted(set(base) | set(head)):
        if key not in head:
            problems.append(f"{key}: missing now")
        elif key not in base:
            problems.append(f"{key}: new (not in the base)")
        elif base[key] != head[key]:
            a, b = base[key].splitlines(), head[key].splitlines()
            line = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)),
            )
            problems.append(f"{key}: differs from line {line + 1}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--base", help="git revision whose code is the reference")
    how.add_argument("--record", type=Path, help="write the working tree's golden set to DIR")
    how.add_argument("--against", type=Path, help="compare the working tree with a recorded set")
    parser.add_argument(
        "--only", action="append", default=[], help="configs whose path contains this"
    )
    parser.add_argument("--limit", type=float, default=30.0, help="seconds a config may take (30)")
    args = parser.parse_args()

    chosen = configs(args.only)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="cpkv-golden-") as tmp_name:
        tmp = Path(tmp_name)
        base_root = base_worktree(args.base, tmp) if args.base else None
        recorded: dict[str, dict[str, bytes]] = {}
        try:
            for config in chosen:
                if base_root is not None:
                    status, seconds, base = collect(base_root, config, args.limit, tmp / "a")
                    if status != "ok":
                        print(f"skip  {config}: base {status} ({seconds:.1f} s)")
                        continue
                elif args.against is not None:
                    base = read_set(args.against, config)
                    if base is None:
                        print(f"skip  {config}: not in {args.against}")
                        continue
                limit = args.limit * 3 if args.record is None else args.limit
                status, seconds, head = collect(ROOT, config, limit, tmp / "b")
                if args.record is not None:
                    if status == "ok":
                        recorded[str(config)] = head
                        print(f"rec   {config}: {len(head)} files ({seconds:.1f} s)")
                    else:
                        print(f"skip  {config}: {status} ({seconds:.1f} s)")
                    continue
                if status != "ok":
                    failures += 1
                    print(f"FAIL  {config}: {status}")
                    continue
                problems = compare(base, head)
                failures += bool(problems)
                verdict = "same " if not problems else "DIFF "
                print(f"{verdict} {config}: {len(head)} files compared ({seconds:.1f} s)")
                for problem in problems[:10]:
                    print(f"        {problem}")
        finally:
            if base_root is not None:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_root)],
                    check=False,
                    capture_output=True,
                )
        if args.record is not None:
            write_set(recorded, args.record)
            print(f"golden set of {len(recorded)} configs written to {args.record}")
            return 0
    print("identical" if failures == 0 else f"{failures} config(s) differ or fail")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
