"""One cpkv process at a time in a sweep directory: an advisory lock on ``sweep.lock``.

A running sweep (or ``--resume``) holds ``fcntl.flock`` on ``<sweep>/sweep.lock`` and writes
into it who holds it (pid, host, start time, command). A second ``cpkv sweep --resume`` on the
same directory is refused with one line naming the holder (exit 2) instead of racing the first
one: both would remove and re-create the same unfinished point directories. The kernel
releases the lock when the holder exits, however it exits (SIGKILL included), so a stale lock
never blocks a resume. The file stays (removing a lock file races a process about to lock it);
its content describes the last holder.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from cpkv.core.errors import InputError
from cpkv.runs.rundir import iso, utc_now

LOCK_FILE = "sweep.lock"

try:
    import fcntl
except ImportError:  # not POSIX: no lock (documented)
    fcntl = None  # type: ignore[assignment]


class SweepLock:
    """The held lock of one sweep directory (:meth:`acquire`, then :meth:`release`)."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, sweep_dir: Path, argv: Sequence[str] = ()) -> SweepLock:
        """Lock ``sweep_dir``; InputError naming the holder when another process has it."""
        path = sweep_dir / LOCK_FILE
        if fcntl is None:
            return cls(path, None)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise InputError(
                f"{sweep_dir}: cannot lock the sweep ({err.strerror or err}); allowed: a sweep "
                "directory this user can write"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _describe(_read(fd))
            os.close(fd)
            raise InputError(
                f"{sweep_dir}: another cpkv sweep is running in it ({holder}); wait for it to "
                "finish, or stop it and resume"
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "start_utc": iso(utc_now()),
                  "argv": list(argv)}  # fmt: skip
        with contextlib.suppress(OSError):  # who holds it is a courtesy: a full disk may refuse
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> SweepLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read(fd: int) -> dict:
    try:
        data = json.loads(os.pread(fd, 65536, 0).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict) -> str:
    if not holder:
        return "holder unknown"
    parts = [f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"]
    if holder.get("start_utc"):
        parts.append(f"since {holder['start_utc']}")
    argv = holder.get("argv")
    if isinstance(argv, list) and argv:
        shown = " ".join(["cpkv", *map(str, argv[1:])])
        parts.append(f"`{shown[:120]}`")
    return ", ".join(parts)
