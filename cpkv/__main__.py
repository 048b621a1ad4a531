"""The ``cpkv`` command's entry point (``python -m cpkv`` too).

The stop signals are handled before anything else is imported, so that one arriving while
the command line loads (typer, the configs, a workload) ends it as one arriving mid-run
does: one line on stderr, ``cpkv: interrupted (SIGTERM)``, and exit status 128 + signal
(:mod:`cpkv.core.signals`). Only the interpreter's own start-up, before this module runs,
is outside it.
"""

from __future__ import annotations

import sys

from cpkv.core import signals


def main() -> None:
    signals.install()  # SIGTERM / SIGHUP stop a run as Ctrl-C does; SIGXFSZ is an OSError
    try:
        from cpkv.cli import app

        app()
    except KeyboardInterrupt as err:  # before the command started, or after it ended
        _stopped(err)
    except SystemExit as err:
        if signals.unreported() is None:
            raise
        _stopped(err)  # (typer ends an interrupt it caught with a silent 130)
    finally:
        signals.ignore_late()


def _stopped(err: BaseException) -> None:
    """The one line and exit status of a stop that no line named yet."""
    signals.ignore_late()
    signals.reported()
    sys.stderr.write(f"cpkv: {signals.reason(err)}\n")
    raise SystemExit(signals.exit_code(err))


if __name__ == "__main__":
    main()
