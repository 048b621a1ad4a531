"""The hostile-input and fault matrix: every bad input and fault cpkv must survive, each as a
separate ``python -m cpkv`` process, with the counts the README's "Bad input" section quotes.

Sections:

* **bad input** — every case of ``tests/hostile/cases.py`` (bad configs, overrides, sizes that
  cannot fit, input files, damaged runs and sweeps, arguments, for every command): exit 2 (or
  the documented code), one ``cpkv: error:`` line naming the file/line/key, no traceback,
  nothing left behind (no run or sweep directory, no temporary file);
* **full disk** — ``RLIMIT_FSIZE`` at ``config.yaml``, ``results.json``, ``sweep.yaml`` and
  ``--write-workload``: one line naming the file, the run marked failed, no partial file;
* **run signals** — SIGINT, SIGTERM, SIGHUP and SIGKILL at random moments of a run;
* **sweep signals** — the same at random moments of a serial and a ``--jobs 2`` sweep (and a
  Ray sweep with ``--ray``), then ``cpkv ls`` and ``--resume``: every point's rows identical
  to an uninterrupted run, none lost, none run twice, the summary matching the disk;
* **concurrency** — a ``--resume`` while the sweep runs (refused, naming the holder).

    python benchmarks/hostile_matrix.py                  # everything but Ray, 3 trials per signal
    python benchmarks/hostile_matrix.py --trials 10 --ray
    python benchmarks/hostile_matrix.py --only config/   # cases whose name contains config/

Prints one line per failure, then the counts; exit 1 when any case failed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.hostile import faults as F  # noqa: E402
from tests.hostile.cases import Case, all_cases, check, held_sweep, leftovers, stop_holders  # noqa: E402


@dataclass
class Tally:
    """Counts of one section."""

    tried: int = 0
    passed: int = 0
    clear_errors: int = 0  # bad input answered with exit 2 and the one expected line
    tracebacks: int = 0
    partial: int = 0  # run/sweep directories or temporary files left where none may be
    failures: list[str] = field(default_factory=list)

    def add(self, name: str, problems: list[str], clear_error: bool = False) -> None:
        self.tried += 1
        if not problems:
            self.passed += 1
            self.clear_errors += clear_error
            return
        text = "; ".join(problems)
        self.tracebacks += "traceback" in text
        self.partial += any(p.startswith(("left behind", "temporary files")) for p in problems)
        self.failures.append(f"{name}: {text}")


def run_case(case: Case, root: Path) -> list[str]:
    folder = Path(tempfile.mkdtemp(prefix="case-", dir=root))
    try:
        for name, data in case.files.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
        if case.setup is not None:
            case.setup(folder)  # absolute paths only: cases run in threads
        before = {str(p.relative_to(folder)) for p in folder.rglob("*")}
        try:
            proc = subprocess.run([sys.executable, "-m", "cpkv", *case.args], cwd=folder, env=F.env(),
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
        except subprocess.TimeoutExpired:
            return ["no answer within 60 s"]
        return check(
            case, proc.returncode, proc.stdout, proc.stderr, leftovers(folder, before, case.keeps)
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bad_input(root: Path, only: str, jobs: int) -> Tally:
    tally = Tally()
    cases = [c for c in all_cases() if only in c.name]
    alone = [c for c in cases if c.setup is held_sweep]  # holds a lock: not beside the others
    together = [c for c in cases if c not in alone]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for case, problems in zip(
            together, pool.map(lambda c: run_case(c, root), together), strict=True
        ):
            tally.add(case.name, problems, clear_error=case.code == 2)
    for case in alone:
        try:
            tally.add(case.name, run_case(case, root), clear_error=case.code == 2)
        finally:
            stop_holders()
    return tally


def in_folder(root: Path, fn, *args) -> list[str]:  # noqa: ANN001
    folder = Path(tempfile.mkdtemp(prefix="fault-", dir=root))
    try:
        return fn(folder, *args)
    except Exception as err:  # noqa: BLE001 - a broken check is a failure, not a crash
        return [f"check raised {type(err).__name__}: {err}"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL)


def faults(
    root: Path, trials: int, rng: random.Random, ray_address: str | None
) -> dict[str, Tally]:
    out = {
        "full disk": Tally(),
        "run signals": Tally(),
        "sweep signals": Tally(),
        "concurrency": Tally(),
    }
    for case in F.FULL_DISK:
        out["full disk"].add(f"full-disk/{case.name}", in_folder(root, F.check_full_disk, case))
    for sig in STOPS:
        for k in range(trials):
            delay = rng.uniform(0.0, 0.8)
            name = f"run/{signal.Signals(sig).name}/{k} (+{delay:.2f}s)"
            out["run signals"].add(name, in_folder(root, F.check_run_signal, sig, delay))
    reference = F.reference_rows(Path(tempfile.mkdtemp(prefix="reference-", dir=root)))
    executors = {"serial": [], "jobs2": ["--jobs", "2"]}
    if ray_address:
        executors["ray"] = ["--executor", "ray", "--ray-address", ray_address, "--jobs", "2"]
    for label, extra in executors.items():
        for sig in STOPS:
            for k in range(trials):
                delay = rng.uniform(0.0, 1.2)
                name = f"sweep/{label}/{signal.Signals(sig).name}/{k} (+{delay:.2f}s)"
                problems = in_folder(root, F.check_sweep_signal, extra, sig, delay, reference)
                out["sweep signals"].add(name, problems)
    out["concurrency"].add("sweep/second-resume", in_folder(root, F.check_second_sweep))
    if ray_address:
        out["concurrency"].add("ray/not-a-gcs-port", in_folder(root, _not_a_gcs_port))
    return out


def _not_a_gcs_port(folder: Path) -> list[str]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        (folder / "h.yaml").write_text("kind: admit\nname: nowhere\n")
        out = F.run(["sweep", "h.yaml", "--executor", "ray", "--ray-address", f"127.0.0.1:{port}",
                     "-o", "out"], folder, timeout=60)  # fmt: skip
    problems = []
    if out.code != 2 or out.seconds > 15 or F.one_line(out.stderr) is None:
        problems.append(f"exit {out.code} after {out.seconds:.1f}s: {out.stderr[-300:]!r}")
    if (folder / "out").exists():
        problems.append("left behind: out")
    return problems


def start_ray(root: Path) -> tuple[subprocess.Popen, str]:
    """A one-node Ray cluster (its own process group, stopped by :func:`stop_ray`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**F.env(), "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen(["ray", "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
                             "--include-dashboard=false", "--disable-usage-stats"], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    from cpkv.sweep.executors import _not_ray

    if not F.wait_for(lambda: _not_ray("127.0.0.1", port, 1.0) is None, 60, 0.2):
        stop_ray(head)
        raise SystemExit("the Ray head did not start")
    return head, f"127.0.0.1:{port}"


def stop_ray(head: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(1.0)
    head.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--trials", type=int, default=3, help="random moments per signal (default 3)"
    )
    parser.add_argument("--only", default="", help="bad-input cases whose name contains this")
    parser.add_argument("--jobs", type=int, default=2, help="bad-input cases at once (default 2)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument(
        "--ray", action="store_true", help="also stop Ray sweeps (starts a local head)"
    )
    parser.add_argument("--no-faults", action="store_true", help="bad input only")
    args = parser.parse_args()
    os.environ["RAY_AUTH_MODE"] = "disabled"  # no token written to ~/.ray by the Ray cases
    os.environ["CPKV_PLOTS"] = "0"
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    sections: dict[str, Tally] = {}
    with tempfile.TemporaryDirectory(prefix="cpkv-hostile-") as tmp:
        root = Path(tmp)
        sections["bad input"] = bad_input(root, args.only, args.jobs)
        if not args.no_faults and not args.only:
            head, address = start_ray(root) if args.ray else (None, None)
            try:
                sections.update(faults(root, args.trials, rng, address))
            finally:
                if head is not None:
                    stop_ray(head)
    for name, tally in sections.items():
        for failure in tally.failures:
            print(f"FAIL [{name}] {failure}")
    print()
    print(
        f"{'section':<15} {'tried':>6} {'passed':>7} {'clear errors':>13} {'tracebacks':>11} {'partial files':>14}"
    )
    total = Counter()
    for name, t in sections.items():
        print(
            f"{name:<15} {t.tried:>6} {t.passed:>7} {t.clear_errors:>13} {t.tracebacks:>11} {t.partial:>14}"
        )
        total.update(
            tried=t.tried, passed=t.passed, clear=t.clear_errors, tb=t.tracebacks, partial=t.partial
        )
    print(
        f"{'total':<15} {total['tried']:>6} {total['passed']:>7} {total['clear']:>13} {total['tb']:>11} {total['partial']:>14}"
    )
    print(
        f"\n{time.monotonic() - t0:.0f} s, python {sys.version.split()[0]}, seed {args.seed}, trials {args.trials}"
    )
    return 0 if total["tried"] == total["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
