"""Reading experiments back: a run-or-sweep target, and the listing of ``cpkv ls``.

A target is a finished run directory or a sweep directory (``sweep.yaml``); the listing shows
runs and sweeps under a root with their status and headline metric
(:func:`cpkv.runs.headline.headline`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cpkv.core.errors import InputError
from cpkv.runs.headline import headline
from cpkv.runs.listed import listed_headline
from cpkv.runs.rundir import (
    STATUS_CORRUPT,
    STATUS_INCOMPLETE,
    LoadedRun,
    is_run_dir,
    load_run,
    read_meta,
    run_status,
)
from cpkv.sweep.plan import SweepPlan
from cpkv.sweep.store import STATUSES, SWEEP_FILE, is_sweep_dir, read_plan, read_summary


@dataclass(frozen=True)
class SweepView:
    """A sweep directory read back: its plan, its summary, and where each point lives."""

    path: Path
    plan: SweepPlan
    doc: dict[str, Any]
    summary: dict[str, Any]

    def point_dir(self, name: str) -> Path:
        return self.path / name

    def readable_summary(self, again: str = "cpkv sweep --resume") -> dict[str, Any]:
        """The summary; InputError naming the sweep when summary.json is missing or damaged,
        with the command that writes it again (``again``, then the sweep's path)."""
        if not self.summary:
            raise InputError(
                f"{self.path}: the sweep has no readable summary.json (missing or corrupt; "
                f"`{again} {self.path}` writes it again)"
            )
        return self.summary


def open_target(path: str | Path) -> LoadedRun | SweepView:
    """A run directory (finished) or a sweep directory; InputError for anything else."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such directory")
    if is_sweep_dir(p):
        plan, doc = read_plan(p)
        return SweepView(p, plan, doc, read_summary(p))
    if is_run_dir(p):
        return load_run(p)
    raise InputError(
        f"{path}: neither a run directory (meta.json) nor a sweep directory ({SWEEP_FILE})"
    )


@dataclass(frozen=True)
class Entry:
    """One line of ``cpkv ls``."""

    time: str
    type: str
    name: str
    kind: str
    status: str
    headline: str
    path: str
    overrides: str = ""  # what tells runs of one config apart: the overrides, a sweep's keys


def list_entries(root: str | Path, *, points: bool = False, kind: str | None = None) -> list[Entry]:
    """Runs and sweeps under ``root``, oldest first (sweep points only with ``points=True``)."""
    base = Path(root)
    if not base.is_dir():
        raise InputError(f"{root}: no such directory")
    sweeps, runs = _walk(base)
    entries = [_sweep_entry(Path(sweep)) for sweep in sorted(sweeps)]
    for run, files in runs:
        inside = _inside(run, sweeps)
        if not inside or points:
            entries.append(_run_entry(Path(run), "point" if inside else "run", files))
    if kind is not None:
        entries = [e for e in entries if kind in e.kind.split(",")]
    return sorted(entries, key=lambda e: (e.time, e.path))


def _walk(base: Path) -> tuple[set[str], list[tuple[str, set[str]]]]:
    """The sweep directories (``sweep.yaml``) and the run directories (``meta.json``, with
    the names of their files, sorted by path) under ``base``, in one walk of the tree
    (symbolic links to folders are not followed)."""
    sweeps, runs = set(), []
    for folder, _, names in os.walk(base):
        if SWEEP_FILE in names:
            sweeps.add(folder)
        if "meta.json" in names:
            runs.append((folder, set(names)))
    runs.sort()
    return sweeps, runs


def _inside(run: str, sweeps: set[str]) -> bool:
    """Whether the run directory ``run`` lies inside one of the ``sweeps``."""
    if not sweeps:
        return False
    folder, up = run, os.path.dirname(run)
    while up != folder:
        if up in sweeps:
            return True
        folder, up = up, os.path.dirname(up)
    return False


def _run_entry(path: Path, kind_of_entry: str, files: set[str] | None = None) -> Entry:
    """One run's line; a run whose files cannot be read back is ``corrupt``, with the reason
    (it never hides the other runs). A finished run's headline comes from its ``meta.json``
    while its files are those it wrote (:mod:`cpkv.runs.listed`)."""
    try:
        meta = _meta_of(path)
    except InputError as err:
        return Entry("", kind_of_entry, path.name, "?", STATUS_CORRUPT, _why(err, path), str(path))
    status = run_status(path, meta, files)
    shown = ""
    if status == "complete":
        values = listed_headline(path, meta)  # None: read the run in full, which says what is wrong
        try:
            shown = _headline_text(headline(load_run(path).record) if values is None else values)
        except InputError as err:
            status, shown = STATUS_CORRUPT, _why(err, path)
    elif meta.get("error"):
        error = str(meta["error"])
        mark = f"{path.name}/"  # a file of this run: name it without the run's own path
        shown = (error.split(mark, 1)[1] if mark in error else error)[:60]
    return Entry(_local(meta.get("start_utc")), kind_of_entry, str(meta.get("name", path.name)),
                 str(meta.get("kind", "?")), status, shown, str(path),
                 _overrides(meta.get("overrides")))  # fmt: skip


def _meta_of(path: Path) -> dict[str, Any]:
    """``meta.json`` of the run at ``path``, read in the fewest steps; when it is not a JSON
    object in UTF-8, :func:`~cpkv.runs.rundir.read_meta` says why (InputError)."""
    try:
        with open(os.path.join(path, "meta.json"), "rb") as fh:
            meta = json.loads(fh.read().decode("utf-8"))
        if isinstance(meta, dict):
            return meta
    except (OSError, ValueError, RecursionError):
        pass
    return read_meta(path)


def _why(err: InputError, path: Path) -> str:
    """The error without the run directory's path (the listing shows it): ``results.json: ...``."""
    text = str(err)
    prefix = f"{path}/"
    return text[len(prefix) :] if text.startswith(prefix) else text.split(": ", 1)[-1]


def _sweep_entry(path: Path) -> Entry:
    try:
        plan, doc = read_plan(path)
    except InputError as err:
        return Entry("", "sweep", path.name, "?", STATUS_CORRUPT, _why(err, path), str(path))
    summary = read_summary(path)
    counts = summary.get("counts") or {}
    kinds = ",".join(dict.fromkeys(p.kind for p in plan.points))
    done = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts.get(s))
    shown = f"{len(plan.points)} points: {done or 'none run'}"
    status = str(summary.get("status", STATUS_INCOMPLETE))
    if status == "complete" and (path / "INCOMPLETE").exists():
        status = STATUS_INCOMPLETE
    swept = ",".join(k.split(".")[-1] for k in plan.swept_keys)
    return Entry(
        _local(doc.get("created_utc")), "sweep", plan.name, kinds, status, shown, str(path),
        f"sweeps {swept}" if swept else "",
    )  # fmt: skip


OVERRIDES_WIDTH = 40


def _overrides(items: Any) -> str:
    """A run's overrides, keys by their last part (``max_batch_requests=4``), cut to fit."""
    if not isinstance(items, list) or not items:
        return ""
    parts = []
    for item in map(str, items):
        key, eq, value = item.partition("=")
        parts.append(f"{key.split('.')[-1]}{eq}{value}")
    text = " ".join(parts)
    return text if len(text) <= OVERRIDES_WIDTH else text[: OVERRIDES_WIDTH - 3] + "..."


def _headline_text(values: Mapping[str, float]) -> str:
    if not values:
        return ""
    name, value = next(iter(values.items()))
    return f"{name}={value:.4g}"


def _local(utc: Any) -> str:
    if not isinstance(utc, str):
        return ""
    try:
        return (
            datetime.fromisoformat(utc.replace("Z", "+00:00"))
            .astimezone()
            .strftime("%Y-%m-%d %H:%M:%S")
        )
    except (ValueError, OverflowError, OSError):
        return utc
