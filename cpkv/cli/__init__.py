"""The ``cpkv`` command line (the only package that imports typer and rich).

Thin: each command parses its arguments, loads a config (:func:`cpkv.core.config.load_config`)
and hands it to :func:`cpkv.runs.runner.run_experiment`, :mod:`cpkv.sweep` or :mod:`cpkv.diff`;
user errors (``CpkvError``) become one line on stderr and exit code 2.

May import: everything. Nothing imports it.
"""

from __future__ import annotations

import typer

from cpkv import MIRRORS, NOT_MIRRORED, __version__
from cpkv.cli import admit as admit_cli
from cpkv.cli import alloc, trace
from cpkv.cli import capacity as capacity_cli
from cpkv.cli import runs as runs_cli
from cpkv.cli import sweep as sweep_cli
from cpkv.cli import validate as validate_cli
from cpkv.cli.usage import OneLineGroup

app = typer.Typer(
    name="cpkv",
    cls=OneLineGroup,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help="cpkv: an offline lab for SGLang CP shared-KV prefill admission and hierarchical KV allocators.",
)
# Command groups and commands are registered here, before the help index below is built.
app.add_typer(alloc.app, name="alloc")
app.command("admit")(admit_cli.admit)
app.command("fit-cost")(admit_cli.fit_cost)
app.command("validate")(validate_cli.validate)
app.add_typer(trace.app, name="trace")
app.command("sweep")(sweep_cli.sweep)
app.command("capacity")(capacity_cli.capacity)
app.command("diff")(runs_cli.diff)
app.command("show")(runs_cli.show)
app.command("ls")(runs_cli.ls)
app.command("plot")(runs_cli.plot)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cpkv {__version__}")
        for engine, version, what in MIRRORS:
            typer.echo(f"  mirrors {engine} {version}: {what}")
        typer.echo(f"  {NOT_MIRRORED}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version,
        is_eager=True,
        help="Show the version, the engines whose semantics cpkv mirrors, and exit.",
    ),
) -> None:
    """cpkv: an offline lab for SGLang CP shared-KV prefill admission and hierarchical KV allocators."""


def _first_line(callback: object) -> str:
    doc = (getattr(callback, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def command_index(typer_app: typer.Typer, prefix: str = "") -> list[tuple[str, str]]:
    """(full command, one-line description) for every leaf command, in registration order."""
    rows = []
    for info in typer_app.registered_commands:
        name = info.name or (info.callback.__name__ if info.callback else "")
        rows.append((f"{prefix}{name}", info.help or _first_line(info.callback)))
    for group in typer_app.registered_groups:
        rows.extend(command_index(group.typer_instance, f"{prefix}{group.name} "))
    return rows


FIRST_STEPS = (
    ("cpkv sweep configs/*.yaml", "the quick suite: every kind once, on CPU"),
    (
        "cpkv capacity configs/capacity/mooncake.yaml",
        "how much load one instance takes under an SLO",
    ),
    (
        "cpkv sweep configs/sweeps/policies.yaml --jobs 2",
        "every waiting-queue and admission policy compared",
    ),
    ("cpkv diff RUN_A RUN_B", "what changed between two runs, and whether it regressed"),
)
"""The next steps the top-level help names, each with what it answers."""


def _epilog() -> str:
    rows = command_index(app)
    width = max(len(name) for name, _ in rows)
    lines = [f"  cpkv {name.ljust(width)}  {desc}" for name, desc in rows]
    engines = [f"  {engine} {version}: {what}" for engine, version, what in MIRRORS]
    engines.append(f"  {NOT_MIRRORED}")
    step_width = max(len(command) for command, _ in FIRST_STEPS)
    steps = [f"  {command.ljust(step_width)}  {what}" for command, what in FIRST_STEPS]
    return (
        "\b\nAll commands:\n"
        + "\n".join(lines)
        + "\n\n\b\nEngines mirrored, decision for decision:\n"
        + "\n".join(engines)
        + "\n\n\b\nFirst steps (from a checkout):\n"
        + "\n".join(steps)
    )


app.info.epilog = _epilog()
