"""``cpkv diff A B --rerun``: measure both runs again, interleaved, and judge the rounds in pairs.

Two runs made one after the other on a shared machine differ by the machine's load as much
as by their code or config; a rank test on their samples is right that the samples differ,
and says nothing about which side is faster. So, as pyperf does, ``--rerun`` runs A's and
B's configs again (their resolved ``config.yaml``, seeds included), A, B, A, B, ... for
``rounds`` rounds in this process and on this machine, and judges each row's statistics
round by round (:mod:`cpkv.diff.rerun.rounds`).

Everything a user can get wrong is refused before anything runs, in one line: a sweep, runs
of two kinds, a kind without timings (its results are deterministic: a plain ``cpkv diff``
settles it), a run without ``config.yaml``, a config this checkout no longer accepts, or
one that cannot run on this machine (a missing input file, CUDA without a GPU: the kind's
``prepare`` says). The runs go to fresh directories under ``out`` (``<out>/<day>/<time>_rerun-
<name>/round01-A``, ..., with ``rerun.json`` listing them in the order they ran), or to a
temporary folder removed afterwards; nothing is written beside A and B.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpkv.core.config import LoadedConfig, load_config
from cpkv.core.errors import ConfigError, CpkvError, InputError
from cpkv.core.kinds import KINDS
from cpkv.diff.compare import DEFAULT_ALPHA, Diff, Rerun, Thresholds, check_alpha, row_metrics
from cpkv.diff.match import config_changes
from cpkv.diff.rerun.paired import MIN_ROUNDS
from cpkv.diff.rerun.rounds import judge_rounds, match_identity
from cpkv.runs.results import RunRecord
from cpkv.runs.rundir import LoadedRun, new_dir, read_meta, write_atomic
from cpkv.runs.runner import run_experiment
from cpkv.sweep.listing import SweepView, open_target

DEFAULT_ROUNDS = 5
RERUN_FILE = "rerun.json"  # the runs of a kept rerun, in the order they ran


@dataclass(frozen=True)
class Side:
    """One side of the comparison: its label (A, B), the run given, its config to run again."""

    label: str
    source: str
    run: LoadedRun
    config: LoadedConfig


def rerun_paths(
    a: str,
    b: str,
    rounds: int = DEFAULT_ROUNDS,
    out: str | Path | None = None,
    thresholds: Thresholds | None = None,
    metrics: Sequence[str] = (),
    ignore: Sequence[str] = (),
    alpha: float = DEFAULT_ALPHA,
    *,
    argv: Sequence[str] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> Diff:
    """Run A's and B's configs ``rounds`` times each, interleaved, and judge them in pairs."""
    check_alpha(alpha)
    if rounds < MIN_ROUNDS:
        raise ConfigError(
            f"--rounds {rounds}: at least {MIN_ROUNDS} (a paired test needs them to tell a "
            f"change from noise; default {DEFAULT_ROUNDS})"
        )
    side_a, side_b = plan_side("A", a), plan_side("B", b)
    if side_a.run.record.kind != side_b.run.record.kind:
        raise InputError(
            f"{b}: is kind {side_b.run.record.kind!r} but {a} is kind {side_a.run.record.kind!r}; "
            "compare runs of one kind"
        )
    # what the rounds will be judged on, checked on the saved runs before anything runs
    match_identity(side_a.run.record, side_b.run.record, ignore)
    row_metrics(side_a.run.record, side_b.run.record, metrics)
    records, runs, kept = run_rounds((side_a, side_b), rounds, out, argv=argv, progress=progress)
    rerun = Rerun(rounds, tuple(runs), kept, 0)
    changed = config_changes(side_a.run.config or {}, side_b.run.config or {})
    return judge_rounds(
        a, b, records[0], records[1], rerun, changed, thresholds or Thresholds(), alpha,
        metrics, ignore, _commit_note(side_a, side_b),
    )  # fmt: skip


def plan_side(label: str, path: str) -> Side:
    """The run at ``path`` and its config, ready to run again here; a one-line CpkvError
    saying why not (see the module docstring)."""
    target = open_target(path)
    if isinstance(target, SweepView):
        raise InputError(
            f"{path}: is a sweep; --rerun runs two runs again (diff sweeps without it)"
        )
    kind = target.record.kind
    timed = [name for name in KINDS.names() if KINDS.get(name).timed]
    if kind not in KINDS or not KINDS.get(kind).timed:
        raise InputError(
            f"{path}: kind {kind!r} has no timings (its results are deterministic): --rerun is "
            f"for timed kinds ({', '.join(timed)}); compare it without --rerun"
        )
    config_file = Path(path) / "config.yaml"
    if not config_file.is_file():
        raise InputError(f"{path}: has no config.yaml, so --rerun has nothing to run again")
    try:
        config = load_config(None, config_file)
        config.spec.check_memory(config.experiment)
        config.spec.prepare_fn()(config.experiment)
    except CpkvError as err:
        raise type(err)(f"{label} ({path}) cannot be re-run here: {err}") from None
    return Side(label, str(path), target, config)


def run_rounds(
    sides: tuple[Side, Side],
    rounds: int,
    out: str | Path | None,
    *,
    argv: Sequence[str] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> tuple[tuple[list[RunRecord], list[RunRecord]], list[dict[str, Any]], str | None]:
    """Run the sides A, B, A, B, ... into fresh directories: each side's records by round,
    the runs in the order they ran, and the folder kept (None: a temporary one, removed)."""
    names = dict.fromkeys(s.config.experiment.name for s in sides)
    if out is not None:
        folder = new_dir(Path(out), "rerun-" + "-".join(names))
    else:
        folder = Path(tempfile.mkdtemp(prefix="cpkv-rerun-"))
    records: tuple[list[RunRecord], list[RunRecord]] = ([], [])
    runs: list[dict[str, Any]] = []
    total = 2 * rounds
    try:
        for r in range(1, rounds + 1):
            for i, side in enumerate(sides):
                if progress is not None:
                    progress(len(runs), total, f"round {r}/{rounds}: {side.label}")
                result = run_experiment(
                    side.config, run_dir=folder / f"round{r:02d}-{side.label}",
                    argv=argv, plots=False,
                )  # fmt: skip
                meta = read_meta(result.path)
                records[i].append(result.record)
                runs.append({"round": r, "side": side.label, "path": str(result.path),
                             "start_utc": meta.get("start_utc"), "end_utc": meta.get("end_utc")})  # fmt: skip
        if progress is not None:
            progress(total, total, f"{rounds} rounds")
    except KeyboardInterrupt as err:
        if out is None:  # the folder goes: do not name a run in it
            err.run_dir = None  # type: ignore[attr-defined]
        raise
    finally:
        if out is None:
            shutil.rmtree(folder, ignore_errors=True)
    if out is None:
        return records, runs, None
    doc = {"a": sides[0].source, "b": sides[1].source, "rounds": rounds, "runs": runs}
    write_atomic(folder / RERUN_FILE, json.dumps(doc, indent=1) + "\n")
    return records, runs, str(folder)


def _commit_note(a: Side, b: Side) -> list[str]:
    """A note when A and B were made by different commits: the rerun measures this checkout."""
    commits = [(s.run.meta.get("git") or {}).get("commit") for s in (a, b)]
    if commits[0] == commits[1] or None in commits:
        return []
    return [
        f"A and B were made at commits {str(commits[0])[:10]} and {str(commits[1])[:10]}; "
        "--rerun ran both configs with this checkout, so it measures their configs and this "
        "machine, not the code between those commits"
    ]
