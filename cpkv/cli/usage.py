"""Usage errors (an unknown command or option, a missing argument) as one line and exit 2.

Click prints a usage block, a hint and the error on several lines; cpkv prints every user
error on one line (``cpkv: error: ...``), with a "did you mean" for a mistyped command and
the command whose ``--help`` explains the rest.
"""

from __future__ import annotations

from typing import IO, Any

import typer
from typer.core import TyperGroup

try:  # typer >= 0.2x carries its own copy of click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older typer runs on click itself
    from click.exceptions import UsageError  # type: ignore[assignment]

from cpkv.core.suggest import did_you_mean


class OneLineUsageError(UsageError):
    """A usage error that shows itself as one line on stderr (pointing at the command's
    ``--help`` unless ``see_help`` is false)."""

    see_help = True

    def show(self, file: IO[Any] | None = None) -> None:
        path = self.ctx.command_path if self.ctx is not None else "cpkv"
        message = self.format_message().rstrip(".")
        see = f" (see `{path} --help`)" if self.see_help else ""
        typer.echo(f"cpkv: error: {message}{see}", err=True)


def _no_args_help(err: UsageError) -> bool:
    """Click's own "no arguments: show the help" signal (a UsageError since click 8.2)."""
    return type(err).__name__ == "NoArgsIsHelpError"


class OneLineGroup(TyperGroup):
    """A command group whose usage errors, and those of its commands, are one line."""

    def resolve_command(
        self, ctx: Any, args: list[str]
    ) -> tuple[str | None, Any | None, list[str]]:
        name = args[0] if args else None
        if name is not None and not name.startswith("-") and self.get_command(ctx, name) is None:
            names = self.list_commands(ctx)
            err = OneLineUsageError(
                f"unknown command {name!r}{did_you_mean(name, names)} (commands: {', '.join(names)})",
                ctx,
            )
            err.see_help = False
            raise err
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as err:
            raise _one_line(err) from None

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except UsageError as err:
            raise _one_line(err) from None


def _one_line(err: UsageError) -> UsageError:
    if isinstance(err, OneLineUsageError) or _no_args_help(err):
        return err
    message = err.format_message()
    if getattr(err, "option_name", None) == "--format":  # a command that runs something
        message += "; a run's results as JSON or CSV: `cpkv show RUN --format json`"
    return OneLineUsageError(message, err.ctx)
