"""Sweep directories on disk: ``sweep.yaml`` (the plan), the point directories, the summary.

``<root>/<YYYY-MM-DD>/<HH-MM-SS-ffffff>_<name>/``::

    sweep.yaml        the plan: configs, overrides, and every point (resolved config included)
    sweep.lock        held (flock) by the cpkv process running the sweep (cpkv.sweep.lock)
    INCOMPLETE        until every point has been attempted
    000_<name>_.../   one ordinary run directory per point
    summary.json      one entry per point: swept values, status, error, headline metrics
    summary.txt       the same as a table
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cpkv.core.errors import InputError
from cpkv.core.schema import to_dict
from cpkv.runs.report import table
from cpkv.runs.rundir import MARKER, STATUS_COMPLETE, STATUS_FAILED, STATUS_INCOMPLETE, write_atomic
from cpkv.sweep.plan import Point, SweepPlan

SWEEP_FILE, SUMMARY_JSON, SUMMARY_TXT = "sweep.yaml", "summary.json", "summary.txt"
STATUS_SKIPPED = "skipped"
"""A point that cannot run on this machine (no CUDA, an optional package missing): its
config is valid, nothing was written for it, the sweep does not fail, and ``--resume``
tries it again (on a machine that has what it needs it runs)."""
STATUSES = (STATUS_COMPLETE, STATUS_SKIPPED, STATUS_FAILED, STATUS_INCOMPLETE)
SWEEP_VERSION = 1
SUPPORTED_SWEEP_VERSIONS = (1,)


@dataclass(frozen=True)
class PointResult:
    """How one point ended. ``status``: complete, skipped (cannot run here; ``error`` says
    why), failed or incomplete (not run or interrupted)."""

    index: int
    name: str
    status: str
    error: str | None = None
    seconds: float | None = None
    headline: dict[str, float] = field(default_factory=dict)


def is_sweep_dir(path: Path) -> bool:
    return (path / SWEEP_FILE).is_file()


def write_plan(path: Path, plan: SweepPlan, meta: Mapping[str, Any]) -> None:
    doc = {
        "sweep_version": SWEEP_VERSION,
        "name": plan.name,
        **meta,
        "configs": list(plan.configs),
        "overrides": list(plan.overrides),
        "zip": list(plan.zips),
        "swept_keys": list(plan.swept_keys),
        "points": [to_dict(p) for p in plan.points],
    }
    write_atomic(path / SWEEP_FILE, yaml.safe_dump(doc, sort_keys=False, width=100))


def read_plan(path: str | Path) -> tuple[SweepPlan, dict[str, Any]]:
    """The plan of a sweep directory (InputError when it is not one)."""
    from cpkv.core.files.yaml_input import RECORD_LIMITS, read_yaml_file

    p = Path(path)
    if not is_sweep_dir(p):
        raise InputError(f"{path}: not a cpkv sweep directory (no {SWEEP_FILE})")
    doc = read_yaml_file(p / SWEEP_FILE, InputError, RECORD_LIMITS, what="sweep plan")
    version = doc.get("sweep_version") if isinstance(doc, dict) else None
    if version not in SUPPORTED_SWEEP_VERSIONS:
        allowed = ", ".join(map(str, SUPPORTED_SWEEP_VERSIONS))
        raise InputError(
            f"{p / SWEEP_FILE}: sweep_version {version!r} is not supported (supported: {allowed})"
        )
    try:
        points = tuple(_point(pt) for pt in doc["points"])
        plan = SweepPlan(
            name=str(doc["name"]),
            configs=tuple(doc["configs"]),
            overrides=tuple(doc["overrides"]),
            zips=tuple(doc.get("zip") or ()),
            points=points,
            swept_keys=tuple(doc.get("swept_keys") or ()),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"{p / SWEEP_FILE}: malformed sweep plan ({err})") from None
    return plan, doc


_POINT_TYPES = {"index": int, "name": str, "kind": str, "config_name": str, "swept": dict,
                "config": dict, "timed": bool}  # fmt: skip


def _point(entry: Any) -> Point:
    """One point of a plan read back; TypeError/KeyError/ValueError when it is malformed."""
    if not isinstance(entry, dict):
        raise TypeError(f"a point is {type(entry).__name__}, not a mapping")
    for key, kind in _POINT_TYPES.items():
        if not isinstance(entry.get(key), kind):
            raise TypeError(f"point field {key!r} is not {kind.__name__}")
    name = entry["name"]
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"point name {name!r} is not a directory name")
    overrides = entry["overrides"]
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise TypeError("point field 'overrides' is not a list of strings")
    return Point(**{**entry, "overrides": tuple(overrides)})


def sweep_status(results: Sequence[PointResult]) -> str:
    statuses = {r.status for r in results}
    if statuses <= {STATUS_COMPLETE, STATUS_SKIPPED}:
        return STATUS_COMPLETE
    if STATUS_INCOMPLETE in statuses:
        return STATUS_INCOMPLETE
    return STATUS_FAILED


def write_summary(path: Path, plan: SweepPlan, results: Mapping[int, PointResult]) -> str:
    """Write summary.json and summary.txt (points without a result are incomplete); return the text."""
    ordered = [
        results.get(p.index) or PointResult(p.index, p.name, STATUS_INCOMPLETE) for p in plan.points
    ]
    entries = []
    for point, res in zip(plan.points, ordered, strict=True):
        entries.append({
            "index": point.index, "name": point.name, "kind": point.kind, "config_name": point.config_name,
            "swept": point.swept, "status": res.status, "error": res.error, "seconds": res.seconds,
            "headline": res.headline,
        })  # fmt: skip
    counts = {s: sum(r.status == s for r in ordered) for s in STATUSES}
    doc = {
        "sweep_version": SWEEP_VERSION,
        "name": plan.name,
        "status": sweep_status(ordered),
        "counts": {"points": len(ordered), **counts},
        "swept_keys": list(plan.swept_keys),
        "points": entries,
    }
    text = summary_table(doc)
    write_atomic(path / SUMMARY_JSON, json.dumps(doc, indent=1) + "\n")
    write_atomic(path / SUMMARY_TXT, text)
    return text


def read_summary(path: Path) -> dict[str, Any]:
    """summary.json, or {} when it is missing or unreadable (it is rewritten from the disk)."""
    try:
        doc = json.loads((path / SUMMARY_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return {}
    return doc if _summary_shape(doc) else {}


def _summary_shape(doc: Any) -> bool:
    """Whether ``doc`` has the shape :func:`write_summary` writes (so readers may index it)."""
    if not isinstance(doc, dict):
        return False
    points = doc.get("points", [])
    ok_points = isinstance(points, list) and all(
        isinstance(pt, dict) and isinstance(pt.get("name"), str) and isinstance(pt.get("status"), str)
        and isinstance(pt.get("headline") or {}, dict) and isinstance(pt.get("swept") or {}, dict)
        for pt in points
    )  # fmt: skip
    keys = doc.get("swept_keys") or []
    return (
        ok_points
        and isinstance(doc.get("counts") or {}, dict)
        and isinstance(keys, list)
        and all(isinstance(k, str) for k in keys)
    )


def summary_table(
    doc: Mapping[str, Any], fmt: str = "text", columns: Sequence[str] | None = None
) -> str:
    """The sweep's points, one table per kind (and per set of headline metrics): each
    completed point's swept values and headline; then the points that did not complete, with
    why; then one line of counts. ``columns``: only these columns (:func:`summary_columns`),
    in one table of every point."""
    points = list(doc.get("points") or [])
    keys = list(doc.get("swept_keys") or [])
    if columns is not None or fmt == "csv":
        rows, all_columns = _flat_rows(points, keys)
        chosen = list(columns) if columns is not None else all_columns
        return table(rows, chosen, fmt) + ("" if fmt == "csv" else "\n")
    groups: dict[tuple[str, tuple[str, ...]], list[Mapping[str, Any]]] = {}
    for pt in points:
        if pt.get("status") == STATUS_COMPLETE:
            metrics = tuple(pt.get("headline") or {})
            groups.setdefault((str(pt.get("kind")), metrics), []).append(pt)
    parts = []
    for (kind, metrics), pts in groups.items():
        swept = [k for k in keys if any(k in (pt.get("swept") or {}) for pt in pts)]
        labels = _labels(swept)
        rows = []
        for pt in pts:
            row = {"point": _index(pt), "config": pt.get("config_name")}
            row.update(
                {lab: (pt.get("swept") or {}).get(k) for lab, k in zip(labels, swept, strict=True)}
            )
            row.update({m: (pt.get("headline") or {}).get(m) for m in metrics})
            rows.append(row)
        names = ", ".join(dict.fromkeys(str(pt.get("config_name")) for pt in pts))
        title = f"{kind}: {_clip(names, 70)}"
        parts.append(
            f"{'## ' if fmt == 'markdown' else ''}{title}\n"
            + table(rows, ["point", "config", *labels, *metrics], fmt)
        )
    others = [pt for pt in points if pt.get("status") != STATUS_COMPLETE]
    if others:
        rows = [{"point": _index(pt), "config": pt.get("config_name"), "kind": pt.get("kind"),
                 "status": pt.get("status"), "reason": _short(pt.get("error"), 100) or "-"}
                for pt in others]  # fmt: skip
        title = "not complete" if fmt != "markdown" else "## not complete"
        parts.append(
            f"{title}\n" + table(rows, ["point", "config", "kind", "status", "reason"], fmt)
        )
    parts.append(counts_line(doc))
    return "\n\n".join(parts) + "\n"


def counts_line(doc: Mapping[str, Any]) -> str:
    """``sweep NAME: 8 points: 7 complete, 1 skipped``."""
    counts = doc.get("counts") or {}
    total = counts.get("points", len(doc.get("points") or []))
    shown = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts.get(s))
    return f"sweep {doc.get('name')}: {total} points: {shown or 'none run'}"


def summary_columns(doc: Mapping[str, Any]) -> list[str]:
    """Every column ``cpkv show SWEEP -c`` can pick."""
    return _flat_rows(list(doc.get("points") or []), list(doc.get("swept_keys") or []))[1]


def _flat_rows(
    points: list[Mapping[str, Any]], keys: list[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    labels = _labels(keys)
    metrics = list(dict.fromkeys(m for pt in points for m in pt.get("headline") or {}))
    rows = []
    for pt in points:
        row = {"point": _index(pt), "name": pt.get("name"), "config": pt.get("config_name"),
               "kind": pt.get("kind"), "status": pt.get("status")}  # fmt: skip
        row.update(
            {lab: (pt.get("swept") or {}).get(k) for lab, k in zip(labels, keys, strict=True)}
        )
        row.update({m: (pt.get("headline") or {}).get(m) for m in metrics})
        row["seconds"] = pt.get("seconds")
        row["error"] = pt.get("error")
        rows.append(row)
    columns = ["point", "name", "config", "kind", *labels, "status", *metrics, "seconds", "error"]
    return rows, columns


def _labels(keys: Sequence[str]) -> list[str]:
    """Swept keys by their last part when that is unambiguous, else whole."""
    leaves = [k.split(".")[-1] for k in keys]
    return leaves if len(set(leaves)) == len(leaves) else list(keys)


def _index(pt: Mapping[str, Any]) -> str:
    return str(pt.get("name", "")).split("_")[0]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(error: str | None, limit: int = 100) -> str | None:
    if not error:
        return None
    line = error.strip().splitlines()[-1] if error.strip() else error
    return line if len(line) <= limit else line[: limit - 3] + "..."


def point_status(path: Path) -> str:
    """complete / failed / incomplete for a point directory (incomplete when it does not exist)."""
    from cpkv.runs.rundir import run_status

    if not path.is_dir():
        return STATUS_INCOMPLETE
    return run_status(path)


def mark_incomplete(path: Path) -> None:
    write_atomic(
        path / MARKER,
        "this sweep has not finished (running, interrupted, or points left to run)\n",
        fsync=False,
    )
