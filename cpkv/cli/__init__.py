"""The ``cpkv`` command line (the only package that imports typer and rich)."""

from __future__ import annotations

import typer

from cpkv import __version__
from cpkv.cli import alloc

app = typer.Typer(
    name="cpkv",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help="cpkv: an offline lab for SGLang CP shared-KV prefill admission and hierarchical KV allocators.",
)
app.add_typer(alloc.app, name="alloc")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cpkv {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """cpkv: an offline lab for SGLang CP shared-KV prefill admission and hierarchical KV allocators."""


def main() -> None:
    app()
