"""Run one validated experiment into a run directory (the programmatic twin of each command)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cpkv.core.config import LoadedConfig
from cpkv.core.envinfo import machine_info, torch_info
from cpkv.core.errors import CpkvError
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

    ``plots`` (default: :func:`plots_wanted`) draws the run's plots under ``plots/`` once its
    results are written; a plot that fails is a warning, never a failed run.

    On Ctrl-C or an error during the run, the directory keeps its ``INCOMPLETE``
    marker, ``meta.json`` says why, and no ``results.json`` is written. ``run_dir`` (used by
    sweeps) names the exact directory to create instead of a new timestamped one under ``root``.
    """
    exp = loaded.experiment
    execute = loaded.spec.prepare_fn()(exp)
    target = (
        RunDir.create_at(Path(run_dir))
        if run_dir is not None
        else RunDir.create(Path(root), exp.name)
    )
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
    target.start(config_yaml=loaded.to_yaml(), overrides=list(loaded.overrides), meta=meta)
    try:
        output = execute(RunContext(run_dir=target.path, progress=progress))
        record = RunRecord.from_output(loaded.spec.name, exp.name, output)
        text = render(record, "text")
        # the run may have imported torch: record its version and thread count
        target.meta.update(torch_info())
        target.finish(record, text, output.extras)
    except KeyboardInterrupt:
        (target.path / "results.json").unlink(missing_ok=True)
        target.fail(STATUS_INCOMPLETE, "interrupted (KeyboardInterrupt)")
        raise
    except Exception as err:
        (target.path / "results.json").unlink(missing_ok=True)
        target.fail(
            STATUS_FAILED,
            str(err) if isinstance(err, CpkvError) else f"{type(err).__name__}: {err}",
        )
        raise
    if plots is not False and plots_wanted():
        _plot(loaded.spec, record, target.path)
    return RunResult(target.path, record, text)


def plots_wanted() -> bool:
    """Plots are drawn when matplotlib is importable, unless ``CPKV_PLOTS=0``."""
    import importlib.util
    import os

    if os.environ.get("CPKV_PLOTS", "1").strip() in ("0", "false", "no", "off"):
        return False
    return importlib.util.find_spec("matplotlib") is not None


def _plot(spec: KindSpec, record: RunRecord, path: Path) -> None:
    import warnings

    try:
        spec.plot_fn()(record, path, path / "plots")
    except Exception as err:  # noqa: BLE001 - the results are written; a plot is a bonus
        warnings.warn(f"{path}/plots: not drawn ({type(err).__name__}: {err})", stacklevel=2)
