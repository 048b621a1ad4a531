"""Faults a run or a sweep must survive: a full disk, stop signals, a second sweep process.

Shared by ``tests/hostile/test_faults.py`` (a few fixed cases, in CI) and
``benchmarks/hostile_matrix.py`` (many random moments). Every helper runs ``python -m cpkv``
as a separate process, as a user, ``timeout`` or a scheduler would.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SWEEP_CONFIG = """\
kind: admit
name: faults
admit:
  workload:
    source: synthetic
    synthetic: {count: 6000}
sweep:
  admit.available_tokens: [20000, 40000, 80000]
  seed: [1, 2]
"""
"""Six deterministic points of about 0.1 s each."""

LONG_RUN = ("admit", "admit.workload.source=synthetic", "admit.workload.synthetic.count=150000")
"""A run that computes for a few seconds once its directory exists."""


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out["CPKV_PLOTS"] = "0"
    out["PYTHONPATH"] = str(REPO) + os.pathsep + out.get("PYTHONPATH", "")
    return out


def start(args: Sequence[str], cwd: Path, file_limit: int | None = None) -> subprocess.Popen:
    """``python -m cpkv ARGS`` in ``cwd`` (``file_limit``: RLIMIT_FSIZE in bytes, a full disk)."""

    def limit() -> None:
        if file_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    return subprocess.Popen(
        [sys.executable, "-m", "cpkv", *args],
        cwd=cwd,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit if file_limit is not None else None,
    )


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    seconds: float


def finish(proc: subprocess.Popen, timeout: float = 60.0) -> Outcome:
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return Outcome(-999, out, err + "\n(timed out)", time.monotonic() - t0)
    return Outcome(proc.returncode, out, err, time.monotonic() - t0)


def run(
    args: Sequence[str], cwd: Path, file_limit: int | None = None, timeout: float = 60.0
) -> Outcome:
    return finish(start(args, cwd, file_limit), timeout)


def wait_for(predicate, timeout: float = 30.0, step: float = 0.01) -> bool:  # noqa: ANN001
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return False


def temp_files(folder: Path) -> list[str]:
    """Temporary files left anywhere under ``folder`` (``.name.tmp-PID``, ``name.tmp``)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if ".tmp" in p.name)


def stray_temp_files(folder: Path, sig: int) -> list[str]:
    """Temporary files that must not be there. A SIGKILLed process cannot remove the one it
    was writing: that one may stay inside its run directory while the run is incomplete (it
    is hidden, no reader takes it for a result; ``--resume`` removes the point)."""
    left = temp_files(folder)
    if sig != signal.SIGKILL:
        return left
    return [t for t in left if complete((folder / t).parent)]


def one_line(stderr: str) -> str | None:
    """The single non-empty stderr line, or None (zero or several lines, or a traceback)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if len(lines) != 1 or "Traceback" in stderr:
        return None
    return lines[0]


def meta(run_dir: Path) -> dict:
    return json.loads((run_dir / "meta.json").read_text())


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("meta.json"))


def rows_without_timing(run_dir: Path) -> list[dict]:
    doc = json.loads((run_dir / "results.json").read_text())
    timing = set(doc["columns"]["timing"])
    return [{k: v for k, v in row.items() if k not in timing} for row in doc["rows"]]


def sweep_of(root: Path) -> Path | None:
    found = [p.parent for p in root.rglob("sweep.yaml")]
    return found[0] if found else None


def point_dirs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and p.name[:3].isdigit())


def complete(point: Path) -> bool:
    from cpkv.runs.rundir import run_status

    return point.is_dir() and run_status(point) == "complete"


def summary_matches_disk(sweep: Path) -> list[str]:
    """Points whose summary.json status disagrees with their directory (empty: they agree)."""
    doc = json.loads((sweep / "summary.json").read_text())
    wrong = []
    for entry in doc["points"]:
        on_disk = complete(sweep / entry["name"])
        if (entry["status"] == "complete") != on_disk:
            wrong.append(f"{entry['name']}: summary {entry['status']}, disk complete={on_disk}")
    return wrong


def stop_signal_code(sig: int) -> int:
    """What cpkv exits with on ``sig``: 128 + signal; a SIGKILLed process reports -9."""
    return -signal.SIGKILL if sig == signal.SIGKILL else 128 + sig


# -- checks (each returns what is wrong; empty: the fault was survived) ------------------------


@dataclass(frozen=True)
class FullDisk:
    """A command run under a file-size limit so that one write fails."""

    name: str
    args: tuple[str, ...]
    limit: int  # bytes: above the files written before, below the one that must fail
    fails: str  # the file named in the error line
    marks_run: bool  # a run directory exists and meta.json says failed
    files: tuple[tuple[str, str], ...] = ()
    before: tuple[str, ...] = ()  # a command run first, without the limit ("{run}": its run)


FULL_DISK = (
    # meta.json (about 600 bytes) fits under 1200, config.yaml (about 1.8 kB) does not
    FullDisk("config.yaml", ("admit", "-o", "out"), 1200, "config.yaml", True),
    # results.txt is about 2 kB, results.json 8 kB
    FullDisk(
        "results.json",
        (
            "alloc",
            "host",
            "alloc_host.host_sizes_gb=[]",
            "alloc_host.host_pages=[600]",
            "alloc_host.request_pages=[8]",
            "alloc_host.repeat=2",
            "alloc_host.warmup=0",
            "-o",
            "out",
        ),
        4096,
        "results.json",
        True,
    ),  # fmt: skip
    # the plan of six points: about 8 kB
    FullDisk(
        "sweep.yaml",
        ("sweep", "s.yaml", "-o", "out"),
        2000,
        "sweep.yaml",
        False,
        (("s.yaml", SWEEP_CONFIG),),
    ),  # fmt: skip
    # 1000 synthetic requests: about 60 kB
    FullDisk(
        "write-workload",
        ("admit", "--write-workload", "w.jsonl", "admit.workload.source=synthetic"),
        4096,
        "w.jsonl",
        False,
    ),  # fmt: skip
    # a serving run's KV-utilisation PNG: tens of kB (`cpkv plot RUN` on a full disk)
    FullDisk(
        "plot",
        ("plot", "{run}"),
        4096,
        "kv_utilization.png",
        False,
        before=("admit", "admit.mode=serving", "--no-plots", "-o", "out"),
    ),  # fmt: skip
)


def check_full_disk(folder: Path, case: FullDisk) -> list[str]:
    for name, text in case.files:
        (folder / name).write_text(text)
    args = case.args
    if case.before:
        first = run(case.before, folder)
        if first.code != 0:
            return [f"the command before failed: {first.stderr[-300:]!r}"]
        (run_dir,) = run_dirs(folder / "out")
        args = tuple(a.replace("{run}", str(run_dir.relative_to(folder))) for a in args)
    before = {str(p.relative_to(folder)) for p in folder.rglob("*")}
    out = run(args, folder, file_limit=case.limit)
    problems = []
    line = one_line(out.stderr)
    if "Traceback" in out.stderr + out.stdout:
        problems.append("traceback")
    if out.code != 2:
        problems.append(f"exit {out.code}, expected 2")
    if line is None or f"{case.fails}: cannot write (file too large)" not in line:
        problems.append(f"stderr is not one line naming {case.fails}: {out.stderr[-300:]!r}")
    runs = run_dirs(folder / "out") if (folder / "out").exists() and not case.before else []
    if case.marks_run:
        if len(runs) != 1:
            problems.append(f"{len(runs)} run directories, expected 1 marked failed")
        else:
            m = meta(runs[0])
            if m.get("status") != "failed" or case.fails not in str(m.get("error")):
                problems.append(f"meta.json says {m.get('status')!r} / {m.get('error')!r}")
            if (runs[0] / "results.json").exists():
                problems.append("results.json written")
    else:
        left = sorted({str(p.relative_to(folder)) for p in folder.rglob("*")} - before)
        left = [p for p in left if not p.endswith("/plots")]  # an empty plots/ folder may stay
        if left:
            problems.append(f"left behind: {left}")
    if temp_files(folder):
        problems.append(f"temporary files: {temp_files(folder)}")
    return problems


def check_run_signal(folder: Path, sig: int, delay: float) -> list[str]:
    """Stop a long run ``delay`` s after its directory appears; it must say why, everywhere."""
    proc = start([*LONG_RUN, "-o", "out"], folder)
    if not wait_for(lambda: (folder / "out").exists() and run_dirs(folder / "out")):
        proc.kill()
        return ["the run never started"]
    time.sleep(delay)
    proc.send_signal(sig)
    out = finish(proc, timeout=30)
    (run_dir,) = run_dirs(folder / "out")
    problems = []
    if "Traceback" in out.stderr:
        problems.append("traceback")
    if out.code == 0:
        return problems  # it finished first: nothing to check
    if out.code != stop_signal_code(sig):
        problems.append(f"exit {out.code}, expected {stop_signal_code(sig)}")
    m = meta(run_dir)
    if sig == signal.SIGKILL:
        listing = run(["ls", "out"], folder)
        if listing.code != 0 or " incomplete " not in listing.stdout:
            problems.append(
                f"ls does not show the killed run incomplete: {listing.stdout[-300:]!r}"
            )
    else:
        name = signal.Signals(sig).name
        expected = f"cpkv: interrupted ({name}); {run_dir.relative_to(folder)} is marked incomplete"
        if one_line(out.stderr) != expected:
            problems.append(f"stderr {out.stderr[-300:]!r}, expected {expected!r}")
        if m.get("status") != "incomplete" or m.get("error") != f"interrupted ({name})":
            problems.append(f"meta.json says {m.get('status')!r} / {m.get('error')!r}")
    if (run_dir / "results.json").exists() or not (run_dir / "INCOMPLETE").exists():
        problems.append("an interrupted run has results.json or lost its INCOMPLETE marker")
    if stray_temp_files(folder, sig):
        problems.append(f"temporary files: {stray_temp_files(folder, sig)}")
    return problems


def reference_rows(folder: Path) -> dict[str, list[dict]]:
    """Every point's rows (timings aside) from an uninterrupted serial sweep of SWEEP_CONFIG."""
    (folder / "s.yaml").write_text(SWEEP_CONFIG)
    out = run(["sweep", "s.yaml", "-o", "out"], folder)
    sweep = sweep_of(folder / "out")
    if out.code != 0 or sweep is None:
        raise RuntimeError(f"the reference sweep failed: {out.stderr}")
    return {p.name: rows_without_timing(p) for p in point_dirs(sweep)}


def check_sweep_signal(
    folder: Path, extra: Sequence[str], sig: int, delay: float, reference: dict[str, list[dict]]
) -> list[str]:
    """Stop a sweep with ``sig`` ``delay`` s after its directory appears (on Ray: after its
    first point, as Ray handles signals itself while it starts); check the directory, ``ls``
    and ``--resume``: every point's rows as in ``reference``, no point run twice."""
    (folder / "s.yaml").write_text(SWEEP_CONFIG)
    proc = start(["sweep", "s.yaml", "-o", "out", *extra], folder)
    started = (
        (lambda: any((folder / "out").rglob("0*_faults_*/meta.json")))
        if "ray" in extra
        else (lambda: sweep_of(folder / "out") is not None)
    )
    if not wait_for(started, 60):
        proc.kill()
        return ["the sweep never started"]
    time.sleep(delay)
    proc.send_signal(sig)
    out = finish(proc, timeout=60)
    sweep = sweep_of(folder / "out")
    assert sweep is not None
    problems = []
    if "Traceback" in out.stderr:
        problems.append("traceback")
    if out.code not in (0, stop_signal_code(sig)):
        problems.append(f"exit {out.code}, expected {stop_signal_code(sig)} (or 0)")
    if out.code != 0 and sig != signal.SIGKILL:
        name = signal.Signals(sig).name
        lines = out.stderr.strip().splitlines()
        if not lines or not lines[-1].startswith(
            f"cpkv: interrupted ({name}); finish with: cpkv sweep --resume"
        ):
            problems.append(f"last stderr line: {lines[-1:]!r}")
        if any(not ln.startswith(("[", "cpkv: note:")) for ln in lines[:-1]):
            problems.append(f"stderr holds more than progress lines: {out.stderr[-300:]!r}")
        problems += [f"summary != disk: {w}" for w in summary_matches_disk(sweep)]
        for point in point_dirs(sweep):
            if not complete(point) and meta(point).get("status") not in ("incomplete", "failed"):
                problems.append(f"{point.name}: meta.json says {meta(point).get('status')!r}")
    for point in point_dirs(sweep):  # (SIGKILL between mkdir and meta.json: --resume redoes it)
        if not (point / "meta.json").exists() and sig != signal.SIGKILL:
            problems.append(f"{point.name}: no meta.json (invisible to ls and --resume)")
    if stray_temp_files(folder, sig):
        problems.append(f"temporary files: {stray_temp_files(folder, sig)}")
    listing = run(["ls", "out", "--points"], folder)
    if listing.code != 0 or "Traceback" in listing.stderr:
        problems.append(f"ls failed: {listing.stderr[-300:]!r}")
    before = {p.name: meta(p)["start_utc"] for p in point_dirs(sweep) if complete(p)}
    resumed = run(["sweep", "--resume", str(sweep.relative_to(folder))], folder)
    if resumed.code != 0:
        return [*problems, f"--resume exit {resumed.code}: {resumed.stderr[-300:]!r}"]
    points = point_dirs(sweep)
    if [p.name for p in points] != sorted(reference):
        problems.append(f"points {[p.name for p in points]} != {sorted(reference)}")
    for point in points:
        if point.name in reference and rows_without_timing(point) != reference[point.name]:
            problems.append(f"{point.name}: rows differ from an uninterrupted run")
        if point.name in before and meta(point)["start_utc"] != before[point.name]:
            problems.append(f"{point.name}: run twice")
    doc = json.loads((sweep / "summary.json").read_text())
    if doc["status"] != "complete" or (sweep / "INCOMPLETE").exists():
        problems.append(f"after --resume the sweep is {doc['status']}")
    if temp_files(folder):
        problems.append(f"temporary files after --resume: {temp_files(folder)}")
    return problems


def check_second_sweep(folder: Path) -> list[str]:
    """A ``--resume`` while the sweep runs is refused in one line naming the holder; the first
    sweep is not disturbed."""
    (folder / "s.yaml").write_text(SWEEP_CONFIG.replace("count: 6000", "count: 15000"))
    first = start(["sweep", "s.yaml", "-o", "out"], folder)
    if not wait_for(lambda: sweep_of(folder / "out") is not None):
        first.kill()
        return ["the sweep never started"]
    sweep = sweep_of(folder / "out")
    assert sweep is not None
    second = run(["sweep", "--resume", str(sweep)], folder)
    problems = []
    line = one_line(second.stderr)
    want = f"{sweep}: another cpkv sweep is running in it (pid {first.pid}"
    if second.code != 2 or line is None or want not in line:
        problems.append(f"second sweep: exit {second.code}, {second.stderr[-300:]!r}")
    done = finish(first)
    if done.code != 0:
        problems.append(f"the first sweep exited {done.code}: {done.stderr[-300:]!r}")
    elif json.loads((sweep / "summary.json").read_text())["status"] != "complete":
        problems.append("the first sweep did not complete")
    return problems


STARTUP_PRELUDE = """\
import sys
sys.argv = ["cpkv", *sys.argv[1:]]
from cpkv.core import signals
from cpkv.__main__ import main
handle = signals.install
def install():
    handle()
    print("ready", flush=True)
signals.install = install
main()
"""
"""The entry point, saying when it handles the stop signals (its first step; before that
only the interpreter starts)."""


def check_startup_signal(folder: Path, sig: int, delay: float) -> list[str]:
    """Stop ``cpkv`` ``delay`` s after it started (while it imports, parses, loads the
    config, builds the workload, or runs): the same one line and status as mid-run."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STARTUP_PRELUDE, *LONG_RUN, "-o", "out"],
        cwd=folder, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    if proc.stdout.readline() != "ready\n":
        proc.kill()
        return ["the entry point never started"]
    time.sleep(delay)
    proc.send_signal(sig)
    out = finish(proc, timeout=30)
    name = signal.Signals(sig).name
    problems = []
    if out.code != stop_signal_code(sig):
        problems.append(f"exit {out.code}, expected {stop_signal_code(sig)}")
    runs = run_dirs(folder / "out") if (folder / "out").exists() else []
    expected = f"cpkv: interrupted ({name})"
    if runs:
        expected += f"; {runs[0].relative_to(folder)} is marked incomplete"
        if (runs[0] / "results.json").exists():
            problems.append("an interrupted run has results.json")
    if one_line(out.stderr) != expected:
        problems.append(f"stderr {out.stderr[-400:]!r}, expected {expected!r}")
    return problems


PARSING_PRELUDE = """\
import os, signal, sys
sys.argv = ["cpkv", *sys.argv[1:]]
from cpkv.cli.usage import OneLineGroup
resolve = OneLineGroup.resolve_command
def stopped_while_parsing(self, ctx, args):
    os.kill(os.getpid(), signal.SIG{name})
    return resolve(self, ctx, args)
OneLineGroup.resolve_command = stopped_while_parsing
from cpkv.__main__ import main
main()
"""
"""The entry point, stopped while the command line is parsed (the command not yet called)."""


def check_parsing_signal(folder: Path, sig: int) -> list[str]:
    """A stop signal while the command line is parsed: one line, exit 128 + signal."""
    name = signal.Signals(sig).name
    prelude = PARSING_PRELUDE.replace("{name}", name[3:])
    out = finish(subprocess.Popen(
        [sys.executable, "-c", prelude, *LONG_RUN, "-o", "out"],
        cwd=folder, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ))  # fmt: skip
    problems = []
    if out.code != stop_signal_code(sig):
        problems.append(f"exit {out.code}, expected {stop_signal_code(sig)}")
    if one_line(out.stderr) != f"cpkv: interrupted ({name})":
        problems.append(f"stderr {out.stderr[-400:]!r}")
    if (folder / "out").exists():
        problems.append("a run directory was made")
    return problems
