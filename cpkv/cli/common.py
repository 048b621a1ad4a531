"""Plumbing shared by the commands: argument splitting, errors, progress, running a kind."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from cpkv.core.errors import ConfigError, CpkvError

F = TypeVar("F", bound=Callable[..., Any])


def args_arg(example: str) -> Any:
    """The ``[CONFIG.yaml] [KEY=VALUE]...`` argument, its help naming a key of this command."""
    return Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[CONFIG.yaml] [KEY=VALUE]...",
            help=f"An optional YAML config, then OmegaConf dotlist overrides (BLOCK.KEY=VALUE, e.g. {example}).",
            show_default=False,
        ),
    ]


FullOpt = Annotated[
    bool,
    typer.Option(
        "--full",
        help="Print every row of the table (by default a long table shows its first and last rows; results.txt holds them all).",
    ),
]
OutputDirOpt = Annotated[
    Path,
    typer.Option("--output-dir", "-o", help="Root folder for run directories.", show_default=True),
]
PrintConfigOpt = Annotated[
    bool, typer.Option("--print-config", help="Print the resolved config and exit without running.")
]


def plots_option(what: str) -> Any:
    """The ``--plots/--no-plots`` flag (None when not given: ``CPKV_PLOTS`` decides), its help
    naming ``what`` is drawn."""
    return Annotated[
        bool | None,
        typer.Option(
            "--plots/--no-plots",
            help=f"Draw {what}; needs matplotlib. Off by default (importing it and drawing "
            "take longer than a small run); CPKV_PLOTS=1 turns plots on; cpkv plot draws them "
            "later.",
            show_default=False,
        ),
    ]


PlotsOpt = plots_option("the run's PNG plots into RUN/plots/ when it ends")


EXECUTOR_NAMES = ("serial", "process", "ray")  # tests check this against cpkv.sweep.EXECUTORS
ExecutorOpt = Annotated[
    str | None,
    typer.Option(
        "--executor",
        help=f"Where points run: {', '.join(EXECUTOR_NAMES)} (default: serial, or process with --jobs > 1).",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="ADDR",
        help="Ray cluster to run on (--executor ray): HOST:PORT or ray://HOST:PORT, checked before anything is written; a local instance when omitted.",
    ),
]


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"cpkv: error: {message}", err=True)
    return typer.Exit(code)


def user_errors(fn: F) -> F:
    """Turn user errors into one line on stderr and exit code 2; Ctrl-C, SIGTERM and SIGHUP
    into one line and exit code 128 + signal (130, 143, 129)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CpkvError as err:
            raise fail(str(err)) from None
        except KeyboardInterrupt as err:
            raise interrupted(err) from None

    return wrapper  # type: ignore[return-value]


def interrupted(err: BaseException, then: str = "", *, run: bool = True) -> typer.Exit:
    """``cpkv: interrupted (SIGTERM); RUN is marked incomplete`` (``run``: name the run
    directory) and ``then`` on stderr, exit 128 + signal."""
    from cpkv.core import signals

    where = getattr(err, "run_dir", None) if run else None
    line = f"cpkv: {signals.reason(err)}"
    if where is not None:
        line += f"; {where} is marked incomplete"
    typer.echo(line + then, err=True)
    signals.reported()
    return typer.Exit(signals.exit_code(err))


def is_path_arg(item: str) -> bool:
    """An argument that names an existing file or folder is a path, even with ``=`` in its
    name (a sweep point's ``RUN/config.yaml``); anything else holding ``=`` is KEY=VALUE."""
    try:
        return Path(item).exists()
    except (OSError, ValueError):  # a name too long, a NUL byte: not a path
        return False


def split_args(args: Sequence[str] | None) -> tuple[str | None, list[str]]:
    """``[CONFIG.yaml] [KEY=VALUE]...`` -> (config path or None, overrides); see
    :func:`is_path_arg` for an argument holding ``=``."""
    config, overrides = None, []
    for item in args or ():
        if "=" in item and not is_path_arg(item):
            overrides.append(item)
        elif config is None:
            config = item
        else:
            raise ConfigError(
                f"one config file per run; got {config!r} and {item!r} (overrides are KEY=VALUE)"
            )
    return config, overrides


def progress_printer() -> Callable[[int, int, str], None] | None:
    """A one-line progress display on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int, label: str) -> None:
        end = "\n" if done >= total else ""
        sys.stderr.write(f"\r\033[K[{done}/{total}] {label}"[:200] + end)
        sys.stderr.flush()

    return show


def wants_plots(plots: bool | None) -> bool:
    """The ``--plots`` / ``--no-plots`` flag when given, else ``CPKV_PLOTS``; ``--plots``
    without matplotlib is an error (exit 2) before anything runs."""
    from cpkv.runs.runner import plots_wanted

    if plots:
        from cpkv.plots.common import require_matplotlib

        require_matplotlib()
    return plots_wanted(plots)


def plot_or_warn(path: Path, draw: Callable[[], object]) -> None:
    """Call ``draw`` (the plots of ``path``, whose results are written): a plot that fails is
    a warning naming ``path/plots``, never a failed command."""
    import warnings

    try:
        draw()
    except Exception as err:  # noqa: BLE001 - the results are written; a plot is a bonus
        warnings.warn(f"{path}/plots: not drawn ({type(err).__name__}: {err})", stacklevel=2)


def run_kind(
    kind: str,
    args: Sequence[str] | None,
    output_dir: Path,
    print_config: bool,
    command: str,
    plots: bool | None = None,
    full: bool = False,
) -> None:
    """Load, validate, run and report one experiment of ``kind``: the table (its first and
    last rows unless ``full``), the notes, the summary, the headline, then the run's path."""
    from cpkv.core.config import load_config
    from cpkv.runs.report import render
    from cpkv.runs.runner import run_experiment

    config, overrides = split_args(args)
    loaded = load_config(kind, config, overrides, command=command)
    if print_config:
        typer.echo(loaded.to_yaml(), nl=False)
        return
    result = run_experiment(
        loaded,
        output_dir,
        argv=sys.argv,
        progress=progress_printer(),
        plots=wants_plots(plots),
    )
    typer.echo(render(result.record, "text", terminal=not full), nl=False)
    typer.echo(str(result.path))
