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
