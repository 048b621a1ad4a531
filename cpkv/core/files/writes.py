"""Writing output files atomically: a temporary name beside the target, then a rename.

A reader never sees a half-written file, and a write that fails (a full disk, a file-size
limit, a read-only folder) leaves no temporary file behind: it raises
:class:`~cpkv.core.errors.OutputError` naming the file and the reason, in one line.
:class:`StreamedFile` does the same for a file written piece by piece (a run's per-request
lines, as the requests end): the pieces go to the temporary name, :meth:`StreamedFile.commit`
renames it into place.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from cpkv.core.errors import OutputError

TMP_TAG = ".tmp-"
"""Temporary files are ``.<name>.tmp-<pid>`` beside their target."""


def tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_TAG}{os.getpid()}")


def write_atomic(path: str | Path, data: str | bytes, *, fsync: bool = True) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file and a rename.

    On any failure (including an interrupt) the temporary file is removed; an ``OSError``
    becomes :class:`OutputError` naming ``path``. Returns ``path``.
    """
    target = Path(path)
    tmp = tmp_path(target)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError):
            raise OutputError(f"{target}: cannot write ({reason(err)})") from None
        raise
    return target


def reason(err: OSError) -> str:
    """``file too large``, ``no space left on device``, ... (lower case, no errno)."""
    text = err.strerror or type(err).__name__
    return text[:1].lower() + text[1:]


def remove_tmp_files(folder: Path) -> None:
    """Remove this process's temporary files under ``folder`` (after an interrupted write)."""
    mine = f"{TMP_TAG}{os.getpid()}"
    with contextlib.suppress(OSError):
        for p in folder.rglob(f".*{mine}"):
            with contextlib.suppress(OSError):
                p.unlink()


_TMP_NAME = re.compile(rf"^\..+{re.escape(TMP_TAG)}(\d+)$")


def stale_tmp_files(folder: Path) -> list[Path]:
    """The temporary files under ``folder`` (:func:`tmp_path`'s names) whose writer is gone:
    no process of their PID runs on this machine (a process killed while it wrote them).
    Those of a process that runs, this one included, are not stale."""
    out = []
    with contextlib.suppress(OSError):
        for p in folder.rglob(f".*{TMP_TAG}*"):
            match = _TMP_NAME.match(p.name)
            if match and not process_exists(int(match.group(1))) and p.is_file():
                out.append(p)
    return sorted(out)


def remove_stale_tmp_files(folder: Path) -> list[Path]:
    """Remove :func:`stale_tmp_files` under ``folder`` (a resume's first step); those removed."""
    removed = []
    for p in stale_tmp_files(folder):
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed


def process_exists(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user's included)."""
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError) as err:
        return isinstance(err, PermissionError)
    return True


class StreamedFile:
    """A text file written piece by piece under its temporary name (:func:`tmp_path`),
    renamed into place by :meth:`commit` or removed by :meth:`discard`; without a ``path``
    the text is kept in memory (:meth:`text`). A write that fails raises
    :class:`OutputError` naming the file."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else Path(path)
        self._parts: list[str] = []
        self._handle = None
        if self.path is not None:
            self._tmp = tmp_path(self.path)
            try:
                self._handle = open(self._tmp, "w", encoding="utf-8")  # noqa: SIM115
            except OSError as err:
                raise OutputError(f"{self.path}: cannot write ({reason(err)})") from None

    def write(self, text: str) -> None:
        if self._handle is None:
            if self.path is None:
                self._parts.append(text)
            return
        try:
            self._handle.write(text)
        except OSError as err:
            self.discard()
            raise OutputError(f"{self.path}: cannot write ({reason(err)})") from None

    def flush(self) -> None:
        """Push what was written so far to the file (a forked writer before it ends)."""
        if self._handle is not None:
            self._handle.flush()

    def text(self) -> str | None:
        """What was written, when kept in memory (no path); else None."""
        return "".join(self._parts) if self.path is None else None

    def commit(self) -> None:
        """Flush, sync and rename into place (nothing to do in memory)."""
        handle = self._handle
        if handle is None:
            return
        try:
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            self._handle = None
            os.replace(self._tmp, self.path)
        except BaseException as err:
            self.discard()
            if isinstance(err, OSError):
                raise OutputError(f"{self.path}: cannot write ({reason(err)})") from None
            raise

    def discard(self) -> None:
        """Close and remove the temporary file (a run that failed)."""
        if self._handle is not None:
            with contextlib.suppress(OSError):
                self._handle.close()
            self._handle = None
            with contextlib.suppress(OSError):
                self._tmp.unlink()
