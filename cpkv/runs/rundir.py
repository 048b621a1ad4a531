"""Run directories: ``<root>/<YYYY-MM-DD>/<HH-MM-SS-ffffff>_<name>/``, written atomically.

A run directory is created *after* its config has been validated, holds an
``INCOMPLETE`` marker until the run has finished, and gets ``results.json`` only once
every result is known. Files are written to a temporary name and renamed into place,
so no reader ever sees a half-written file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cpkv.core.errors import InputError
from cpkv.runs.results import RunRecord

DEFAULT_ROOT = Path("experiments")
MARKER = "INCOMPLETE"
STATUS_COMPLETE, STATUS_INCOMPLETE, STATUS_FAILED = "complete", "incomplete", "failed"
_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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


def _reason(err: OSError) -> str:
    return (err.strerror or type(err).__name__).lower()


@dataclass
class RunDir:
    """A run directory being written."""

    path: Path
    meta: dict[str, Any]

    @classmethod
    def create(cls, root: Path, name: str, now: datetime | None = None) -> RunDir:
        local = (now or utc_now()).astimezone()
        day = root / local.strftime("%Y-%m-%d")
        try:
            day.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # the root is a file, read-only, ...
            raise InputError(f"{root}: cannot hold run directories ({_reason(err)})") from None
        stem = f"{local.strftime('%H-%M-%S-%f')}_{safe_name(name)}"
        for attempt in range(1000):
            path = day / (stem if attempt == 0 else f"{stem}-{attempt}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            except OSError as err:
                raise InputError(f"{day}: cannot create a run directory ({_reason(err)})") from None
            return cls._marked(path)
        raise InputError(f"{day}: cannot create a new run directory for {name!r}")

    @classmethod
    def create_at(cls, path: Path) -> RunDir:
        """Create exactly ``path`` (a sweep point); its parent must exist, ``path`` must not."""
        try:
            path.mkdir()
        except FileExistsError:
            raise InputError(f"{path}: already exists; a run directory is never reused") from None
        except OSError as err:
            raise InputError(f"{path}: cannot create the run directory ({_reason(err)})") from None
        return cls._marked(path)

    @classmethod
    def _marked(cls, path: Path) -> RunDir:
        (path / MARKER).write_text(
            "this run has not finished (still running, interrupted or failed)\n"
        )
        return cls(path, {})

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, text)
        return target

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_text(name, json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n")

    def start(self, *, config_yaml: str, overrides: list[str], meta: Mapping[str, Any]) -> None:
        self.write_text("config.yaml", config_yaml)
        self.write_text("overrides.yaml", _yaml_list(overrides))
        self.meta = {**meta, "status": "running", "start_utc": iso(utc_now()), "end_utc": None}
        self.write_json("meta.json", self.meta)

    def finish(self, record: RunRecord, table: str, extras: Mapping[str, str]) -> None:
        """Write extras, the table, then results.json, then mark the run complete."""
        for name, text in extras.items():
            self.write_text(name, text)
        self.write_text("results.txt", table if table.endswith("\n") else table + "\n")
        self.write_text("results.json", record.to_json())
        self._end(STATUS_COMPLETE)
        (self.path / MARKER).unlink(missing_ok=True)

    def fail(self, status: str, error: str) -> None:
        """Record that the run stopped early; the INCOMPLETE marker stays."""
        self.meta["error"] = error
        self._end(status)

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


def run_status(path: Path) -> str:
    meta = _read_meta(path)
    if meta.get("status") == "failed":
        return STATUS_FAILED
    if (path / MARKER).exists() or not (path / "results.json").exists():
        return STATUS_INCOMPLETE
    return STATUS_COMPLETE


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / "meta.json").exists() and (path / "config.yaml").exists()


def load_run(path: str | Path) -> LoadedRun:
    """Read a finished run directory (InputError when it is not one)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such directory")
    if not is_run_dir(p):
        raise InputError(f"{path}: not a cpkv run directory (no meta.json / config.yaml)")
    results = p / "results.json"
    if not results.exists():
        raise InputError(f"{path}: run is {run_status(p)} (no results.json)")
    record = RunRecord.from_json(results.read_text(encoding="utf-8"), str(results))
    return LoadedRun(p, _read_meta(p), (p / "config.yaml").read_text(encoding="utf-8"), record)


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "meta.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def find_runs(root: str | Path) -> list[Path]:
    """Every run directory under ``root`` (sorted by path, i.e. by time)."""
    base = Path(root)
    if not base.exists():
        return []
    return sorted(p.parent for p in base.rglob("meta.json") if is_run_dir(p.parent))
