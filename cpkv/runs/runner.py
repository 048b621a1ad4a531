"""Run one validated experiment into a run directory (the programmatic twin of each command)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cpkv.core import signals
from cpkv.core.config import LoadedConfig
from cpkv.core.envinfo import machine_info, torch_info
from cpkv.core.errors import CpkvError, OutputError
from cpkv.core.kinds import KindSpec, RunContext
from cpkv.runs.report import render
from cpkv.runs.results import RunRecord
from cpkv.runs.rundir import DEFAULT_ROOT, STATUS_FAILED, STATUS_INCOMPLETE, RunDir


@dataclass(frozen=True)
class RunResult:
    path: Path
    record: RunRecord
    table: str


def run_experiment(
    loaded: LoadedConfig,
    root: str | Path = DEFAULT_ROOT,
    *,
    argv: Sequence[str] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    run_dir: str | Path | None = None,
    plots: bool | None = None,
) -> RunResult:
    """Prepare (all user errors surface here, before any directory exists), then run.

    ``plots`` (None: as :func:`plots_wanted` says) draws the run's plots under ``plots/`` once
    its results are written; a plot that fails (matplotlib missing included) is a warning,
    never a failed run.

    The memory the run needs is checked first (:meth:`KindSpec.check_memory`). On Ctrl-C,
    SIGTERM or SIGHUP (status ``incomplete``) or an error during the run, including a write
    that fails on a full disk (status ``failed``), the directory keeps its ``INCOMPLETE``
    marker, ``meta.json`` says why, no ``results.json`` and no temporary file is left.
    ``run_dir`` (used by sweeps) names the exact directory to create instead of a new
    timestamped one under ``root``.
    """
    exp = loaded.experiment
    loaded.spec.check_memory(exp)
    execute = loaded.spec.prepare_fn()(exp)
    device = getattr(getattr(exp, loaded.spec.block, None), "device", None)
    meta = {
        "kind": loaded.spec.name,
        "name": exp.name,
        "seed": getattr(exp, "seed", None),
        "config_source": loaded.source,
        "overrides": list(loaded.overrides),
        "argv": list(argv if argv is not None else sys.argv),
        **machine_info(device),
    }
    target = (
        RunDir.create_at(Path(run_dir), meta)
        if run_dir is not None
        else RunDir.create(Path(root), exp.name, meta)
    )
    ctx = RunContext(run_dir=target.path, progress=progress)
    try:
        target.start(config_yaml=loaded.to_yaml(), overrides=list(loaded.overrides))
        output = execute(ctx)
        record = RunRecord.from_output(loaded.spec.name, exp.name, output)
        text = render(record, "text")
        # the run may have imported torch: record its version and thread count
        target.meta.update(torch_info())
        target.finish(record, text, output.extras, list(ctx.streams.values()))
    except KeyboardInterrupt as err:  # Ctrl-C, and SIGTERM / SIGHUP (cpkv.core.signals)
        _discard(ctx)
        target.fail(STATUS_INCOMPLETE, signals.reason(err))
        err.run_dir = target.path  # type: ignore[attr-defined]  # for the command's last line
        raise
    except Exception as err:
        _discard(ctx)
        target.fail(
            STATUS_FAILED,
            str(err) if isinstance(err, CpkvError) else f"{type(err).__name__}: {err}",
        )
        if isinstance(err, OutputError):  # the reader needs the directory the failure is in
            raise OutputError(f"{err}; the run is marked failed in its meta.json") from None
        raise
    if plots_wanted(plots):
        _plot(loaded.spec, record, target.path)
    return RunResult(target.path, record, text)


def _discard(ctx: RunContext) -> None:
    """Remove the files the run streamed (it failed: none of them is kept)."""
    for file in ctx.streams.values():
        file.discard()


PLOTS_ON = ("1", "true", "yes", "on")


def plots_wanted(plots: bool | None = None) -> bool:
    """Whether a run draws its plots: ``plots`` when it says (``--plots`` / ``--no-plots``),
    else ``CPKV_PLOTS`` (``1``, ``true``, ``yes`` or ``on``: drawn). Off by default: importing
    matplotlib and drawing cost more than a small run itself (``benchmarks/plot_cost.py``)."""
    import os

    if plots is not None:
        return plots
    return os.environ.get("CPKV_PLOTS", "").strip().lower() in PLOTS_ON


def _plot(spec: KindSpec, record: RunRecord, path: Path) -> None:
    import warnings

    try:
        spec.plot_fn()(record, path, path / "plots")
    except Exception as err:  # noqa: BLE001 - the results are written; a plot is a bonus
        warnings.warn(f"{path}/plots: not drawn ({type(err).__name__}: {err})", stacklevel=2)
