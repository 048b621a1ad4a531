"""Writing output files atomically: a temporary name beside the target, then a rename.

A reader never sees a half-written file, and a write that fails (a full disk, a file-size
limit, a read-only folder) leaves no temporary file behind: it raises
:class:`~cpkv.core.errors.OutputError` naming the file and the reason, in one line.
"""

from __future__ import annotations

import contextlib
import os
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
