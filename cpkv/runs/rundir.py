"""Run directories: ``<root>/<YYYY-MM-DD>/<HH-MM-SS-ffffff>_<name>/``, written atomically.

A run directory is created *after* its config has been validated. Its first file is
``meta.json`` (``"status": "running"``), so every run directory that exists is visible to
``cpkv ls`` and ``--resume``, whatever happens next; it holds an ``INCOMPLETE`` marker until
the run has finished, and gets ``results.json`` only once every result is known. Files are
written to a temporary name and renamed into place (:func:`cpkv.core.files.writes.write_atomic`), so
no reader ever sees a half-written file. A run that stops early (an error, a full disk,
Ctrl-C, SIGTERM) keeps the marker and ``meta.json`` says why (``status`` ``failed`` or
``incomplete``, ``error``); its temporary files are removed.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cpkv.core.errors import CpkvError, InputError, OutputError
from cpkv.core.files.writes import StreamedFile, reason, remove_tmp_files, write_atomic
from cpkv.runs.results import RunRecord

__all__ = ["write_atomic"]  # re-exported: the sweep store writes through it too

DEFAULT_ROOT = Path("experiments")
MARKER = "INCOMPLETE"
STATUS_COMPLETE, STATUS_INCOMPLETE, STATUS_FAILED = "complete", "incomplete", "failed"
STATUS_CORRUPT = "corrupt"
"""``cpkv ls``: a run or sweep directory whose files cannot be read back (the reason is shown)."""
_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso(ts: datetime) -> str:
    return ts.isoformat(timespec="microseconds").replace("+00:00", "Z")


NAME_LIMIT = 48
"""The most characters of a run's name that go into its directory name."""


def safe_name(name: str, limit: int = NAME_LIMIT) -> str:
    """``name`` as a file name: unsafe characters as ``-``, at most ``limit`` characters
    (:func:`bounded`)."""
    return bounded(_SAFE.sub("-", name).strip("-") or "run", limit)


def bounded(name: str, limit: int) -> str:
    """``name`` when it fits ``limit`` characters; else its start and 8 hex digits of its
    SHA-1, so that names cut alike stay apart and the same name always cuts the same way."""
    if len(name) <= limit:
        return name
    import hashlib

    digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:8]
    return f"{name[: max(1, limit - 9)].rstrip('-_+=.')}-{digest}"


def new_dir(root: Path, name: str, now: datetime | None = None) -> Path:
    """Create ``<root>/<day>/<time>_<name>`` (never reused); InputError when it cannot be
    created, with any folder this call created removed again."""
    local = (now or utc_now()).astimezone()
    day = root / local.strftime("%Y-%m-%d")
    made = [p for p in (day, *day.parents) if not p.exists()]
    try:
        day.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # the root is a file, read-only, ...
        raise InputError(f"{root}: cannot hold run directories ({reason(err)})") from None
    stem = f"{local.strftime('%H-%M-%S-%f')}_{safe_name(name)}"
    for attempt in range(1000):
        path = day / (stem if attempt == 0 else f"{stem}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as err:
            remove_empty(made)
            raise InputError(f"{day}: cannot create a run directory ({reason(err)})") from None
        return path
    remove_empty(made)
    raise InputError(f"{day}: cannot create a new run directory for {name!r}")


def remove_empty(folders: Sequence[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty."""
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:
            return


@dataclass
class RunDir:
    """A run directory being written."""

    path: Path
    meta: dict[str, Any]
    config_text: str = ""  # config.yaml as written (its digest goes into meta.json's listed block)

    @classmethod
    def create(
        cls, root: Path, name: str, meta: Mapping[str, Any], now: datetime | None = None
    ) -> RunDir:
        """A new timestamped run directory under ``root``, ``meta.json`` written first."""
        made = [p for p in (root, *root.parents) if not p.exists()]
        path = new_dir(root, name, now)
        try:
            return cls._started(path, meta)
        except BaseException:
            remove_empty([path.parent, *made])
            raise

    @classmethod
    def create_at(cls, path: Path, meta: Mapping[str, Any]) -> RunDir:
        """Create exactly ``path`` (a sweep point); its parent must exist, ``path`` must not."""
        try:
            path.mkdir()
        except FileExistsError:
            raise InputError(f"{path}: already exists; a run directory is never reused") from None
        except OSError as err:
            raise InputError(f"{path}: cannot create the run directory ({reason(err)})") from None
        return cls._started(path, meta)

    @classmethod
    def _started(cls, path: Path, meta: Mapping[str, Any]) -> RunDir:
        """``meta.json`` (status running), then the ``INCOMPLETE`` marker, in the new ``path``;
        when either cannot be written (or an interrupt arrives), ``path`` is removed again:
        a directory without ``meta.json`` would be invisible to ``ls`` and ``--resume``."""
        run = cls(path, {**meta, "status": "running", "start_utc": iso(utc_now()), "end_utc": None})
        try:
            run.write_json("meta.json", run.meta)
            write_atomic(
                path / MARKER,
                "this run has not finished (still running, interrupted or failed)\n",
                fsync=False,
            )
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return run

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OutputError(f"{target.parent}: cannot create ({reason(err)})") from None
        return write_atomic(target, text)

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_text(name, json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n")

    def start(self, *, config_yaml: str, overrides: list[str]) -> None:
        self.config_text = config_yaml
        self.write_text("config.yaml", config_yaml)
        self.write_text("overrides.yaml", _yaml_list(overrides))

    def finish(
        self,
        record: RunRecord,
        table: str,
        extras: Mapping[str, str],
        streamed: Sequence[StreamedFile] = (),
    ) -> None:
        """Write extras, rename the ``streamed`` ones into place, write the table, then
        results.json, then mark the run complete (``meta.json`` with what a listing reads:
        :mod:`cpkv.runs.listed`)."""
        from cpkv.runs import listed

        for name, text in extras.items():
            self.write_text(name, text)
        for file in streamed:
            file.commit()
        self.write_text("results.txt", table if table.endswith("\n") else table + "\n")
        results = record.to_json()
        self.write_text("results.json", results)
        self.meta[listed.KEY] = listed.block_of(results, self.config_text)
        self._end(STATUS_COMPLETE)
        (self.path / MARKER).unlink(missing_ok=True)

    def fail(self, status: str, error: str) -> None:
        """Record that the run stopped early: no results.json, no temporary file, the INCOMPLETE
        marker stays and meta.json says why (best effort: on a full disk meta.json may keep
        ``running``, which ``cpkv ls`` shows as incomplete)."""
        remove_tmp_files(self.path)
        with contextlib.suppress(OSError):
            (self.path / "results.json").unlink(missing_ok=True)
        self.meta["error"] = error
        with contextlib.suppress(CpkvError):
            self._end(status)
        remove_tmp_files(self.path)

    def _end(self, status: str) -> None:
        self.meta.update(status=status, end_utc=iso(utc_now()))
        self.write_json("meta.json", self.meta)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _yaml_list(items: list[str]) -> str:
    if not items:
        return "[]\n"
    return "".join(f"- {json.dumps(item)}\n" for item in items)


# -- reading runs back ---------------------------------------------------------------


@dataclass(frozen=True)
class LoadedRun:
    path: Path
    meta: dict[str, Any]
    config_text: str
    record: RunRecord
    config: dict[str, Any] | None = None  # config.yaml parsed (bounded, checked)


def read_file_text(file: Path) -> str:
    """The UTF-8 text of ``file``; InputError naming it (unreadable, not UTF-8) otherwise."""
    from cpkv.core.files.yaml_input import decode_utf8

    try:
        data = file.read_bytes()
    except OSError as err:
        raise InputError(f"{file}: cannot read ({reason(err)})") from None
    return decode_utf8(data, str(file), InputError)


def read_meta(path: Path) -> dict[str, Any]:
    """``meta.json`` of a run directory; InputError naming it when missing or not a JSON object."""
    file = path / "meta.json"
    try:
        meta = json.loads(read_file_text(file))
    except json.JSONDecodeError as err:
        raise InputError(f"{file}:{err.lineno}: not valid JSON ({err.msg})") from None
    except RecursionError:
        raise InputError(f"{file}: not valid here (nested too deeply)") from None
    if not isinstance(meta, dict):
        raise InputError(f"{file}: expected a JSON object, got {type(meta).__name__}")
    return meta


def run_status(
    path: Path, meta: Mapping[str, Any] | None = None, files: Collection[str] | None = None
) -> str:
    """complete, failed, incomplete (running, interrupted), or corrupt (meta.json unreadable);
    ``meta``: the run's ``meta.json`` when it has been read already, ``files``: the names of
    the files in ``path`` when they are known (a listing's walk)."""
    if meta is None:
        try:
            meta = read_meta(path)
        except InputError:
            return STATUS_CORRUPT
    if meta.get("status") == STATUS_FAILED:
        return STATUS_FAILED
    if files is None:
        marked, results = (path / MARKER).exists(), (path / "results.json").exists()
    else:
        marked, results = MARKER in files, "results.json" in files
    if marked or not results:
        return STATUS_INCOMPLETE
    return STATUS_COMPLETE


def is_run_dir(path: Path) -> bool:
    """A folder holding ``meta.json`` (every run directory has it from its first moment)."""
    return path.is_dir() and (path / "meta.json").is_file()


def load_run(path: str | Path) -> LoadedRun:
    """Read a finished run directory; InputError naming the file that is missing or unreadable
    (meta.json, results.json, config.yaml) otherwise."""
    from cpkv.core.files.yaml_input import RECORD_LIMITS, read_yaml_file

    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such directory")
    if not is_run_dir(p):
        raise InputError(f"{path}: not a cpkv run directory (no meta.json)")
    meta = read_meta(p)
    results = p / "results.json"
    if not results.exists():
        status = run_status(p)
        why = f": {meta['error']}" if meta.get("error") else ""
        raise InputError(f"{path}: run is {status} (no results.json){why}")
    record = RunRecord.from_json(read_file_text(results), str(results))
    config_file = p / "config.yaml"
    config_text = read_file_text(config_file) if config_file.exists() else ""
    config = read_yaml_file(config_file, InputError, RECORD_LIMITS) if config_text else {}
    if not isinstance(config, dict):
        raise InputError(
            f"{config_file}: expected a mapping of config keys, got {type(config).__name__}"
        )
    return LoadedRun(p, meta, config_text, record, config)


def find_runs(root: str | Path) -> list[Path]:
    """Every run directory under ``root`` (sorted by path, i.e. by time)."""
    base = Path(root)
    if not base.exists():
        return []
    return sorted(p.parent for p in base.rglob("meta.json") if is_run_dir(p.parent))
