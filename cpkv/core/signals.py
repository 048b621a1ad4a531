"""Signals: SIGTERM and SIGHUP stop cpkv the way Ctrl-C does, and a file-size limit is an error.

``timeout``, ``kill``, batch schedulers, Ray and a closed terminal stop a process with SIGTERM
or SIGHUP, whose default action ends Python at once: a run directory would keep
``"status": "running"`` forever. :func:`install` turns them into :class:`Interrupted` (a
``KeyboardInterrupt``), so every ``except KeyboardInterrupt`` that marks a run or a sweep
incomplete handles them too, and the process exits with ``128 + signal`` (Ctrl-C: 130).

SIGXFSZ (a write past ``ulimit -f``) is ignored, so that the write fails with ``OSError``
(``File too large``) and is reported like a full disk instead of killing the process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived (SIGINT, SIGTERM or SIGHUP)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signum_of(err: BaseException) -> int:
    """The signal behind ``err``: an :class:`Interrupted`'s, else the one :func:`install`'s
    handler saw last (a library may turn the exception into a plain ``KeyboardInterrupt``, as
    Ray's ``ray.wait`` does), else SIGINT (Python's own Ctrl-C)."""
    if isinstance(err, Interrupted):
        return err.signum
    return _last if _last is not None else int(signal.SIGINT)


def signal_name(err: BaseException) -> str:
    """``SIGTERM``, ``SIGHUP`` or ``SIGINT``: see :func:`signum_of`."""
    return signal.Signals(signum_of(err)).name


def exit_code(err: BaseException) -> int:
    """``128 + signal``: 130 for Ctrl-C (SIGINT), 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + signum_of(err)


def reason(err: BaseException) -> str:
    """What ``meta.json`` and the summary say about an interrupted run: ``interrupted (SIGTERM)``."""
    return f"interrupted ({signal_name(err)})"


_raised = False
_last: int | None = None  # the stop signal the handler saw
_reported = False  # the command's last line named it
_worker = False  # in a sweep's worker process
_busy = False  # a worker is running a point


def _raise(signum: int, frame: FrameType | None) -> None:
    """Raise :class:`Interrupted` once; later signals are ignored while cpkv cleans up (it
    marks the run incomplete and exits within moments; SIGKILL still ends it at once). An idle
    worker process has nothing to clean up: it exits at once."""
    global _raised, _last
    if _worker and not _busy:
        os._exit(128 + signum)
    if _raised:
        return
    _raised, _last = True, signum
    raise Interrupted(signum)


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """In a worker: a point runs inside (a stop signal interrupts it; outside, the worker exits)."""
    global _busy
    _busy = True
    try:
        yield
    finally:
        _busy = False


def reported() -> None:
    """The command's last line named the stop signal (:func:`unreported` is then None)."""
    global _reported
    _reported = True


def unreported() -> int | None:
    """The stop signal the handler saw when no line named it yet, else None."""
    return None if _reported else _last


def install() -> None:
    """Handle the stop signals in this process (the ``cpkv`` command calls it first)."""
    global _raised, _last, _reported
    _raised, _last, _reported = False, None, False
    for name in STOP_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _raise)
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def ignore_late() -> None:
    """The command has ended (its exit status is decided): a stop signal now changes nothing,
    so it is ignored rather than killing the interpreter while it exits (Python re-raises an
    uncaught KeyboardInterrupt as a death by SIGINT)."""
    for name in STOP_SIGNALS:
        if hasattr(signal, name):
            with contextlib.suppress(ValueError, OSError):
                signal.signal(getattr(signal, name), signal.SIG_IGN)


def worker_install() -> None:
    """In a sweep's worker process: SIGINT is ignored (a terminal's Ctrl-C reaches the whole
    process group; the sweep's driver decides and stops the workers with SIGTERM), SIGTERM and
    SIGHUP interrupt the point being run (see :func:`busy`) or end an idle worker.

    A worker whose driver died without stopping it (SIGKILL) stops itself as on SIGTERM: an
    orphaned worker would otherwise wait for work forever (it holds its own end of the task
    queue, so it never sees the driver go), keeping the driver's terminal pipes open."""
    global _worker
    install()
    _worker = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()


PARENT_POLL_S = 0.25


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)


def snapshot() -> dict[int, object]:
    """The Python handlers of the stop signals (and SIGXFSZ) now, for :func:`restore`."""
    names = (*STOP_SIGNALS, "SIGXFSZ")
    return {
        int(getattr(signal, n)): signal.getsignal(getattr(signal, n))
        for n in names
        if hasattr(signal, n)
    }


def restore(saved: dict[int, object]) -> None:
    """Put back handlers a library replaced (``ray.init`` installs its own SIGTERM handler,
    which exits with status 1 and a stack dump instead of marking the sweep's points)."""
    for signum, handler in saved.items():
        if handler is None:  # not installed from Python: leave it
            continue
        with contextlib.suppress(ValueError, OSError):  # not the main thread: nothing to restore
            signal.signal(signum, handler)  # type: ignore[arg-type]
