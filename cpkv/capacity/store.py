"""A capacity search on disk: a sweep directory with the search's own files beside it.

``<root>/<YYYY-MM-DD>/<HH-MM-SS-ffffff>_capacity-<name>/``::

    capacity.yaml     the search: config, overrides, load key, second axis, settings, and
                      each axis value's resolved config (``--resume`` reads it back)
    sweep.yaml        the points tried so far, as a sweep plan (cpkv ls / show / diff / plot)
    sweep.lock        held by the cpkv process running the search (cpkv.sweep.lock)
    INCOMPLETE        until every search has ended
    000_<name>_.../   one ordinary run directory per point
    summary.json/txt  the sweep summary of the points (headline metrics)
    capacity.json     the result: per axis value the points in the order tried (load, offered
                      requests/s, SLO attainment, goodput...), the bracket and the capacity
    capacity.txt      the same as tables (what the command printed)
    plots/capacity.png  attainment and goodput against the offered load, capacities marked
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cpkv.capacity.plan import AxisValue, CapacitySpec, SearchPlan
from cpkv.core.errors import InputError
from cpkv.core.schema import build, to_dict
from cpkv.runs.report import table
from cpkv.runs.rundir import write_atomic

SEARCH_FILE, RESULT_JSON, RESULT_TXT = "capacity.yaml", "capacity.json", "capacity.txt"
PLOT_FILE = "capacity.png"
CAPACITY_VERSION = 1


def is_search_dir(path: Path) -> bool:
    return (Path(path) / SEARCH_FILE).is_file()


def resume_command(path: Path) -> str:
    """The command that finishes the sweep directory ``path`` (and rewrites its summary)."""
    return "cpkv capacity --resume" if is_search_dir(path) else "cpkv sweep --resume"


def write_search(path: Path, plan: SearchPlan, meta: Mapping[str, Any]) -> None:
    doc = {
        "capacity_version": CAPACITY_VERSION,
        "name": plan.name,
        **meta,
        "config": plan.config_path,
        "config_name": plan.config_name,
        "overrides": list(plan.overrides),
        "load_key": plan.load_key,
        "axis_key": plan.axis_key,
        "settings": to_dict(plan.spec),
        "start": plan.start,
        "slo": plan.slo,
        "values": [
            {"label": v.label, "value": v.value, "overrides": list(v.overrides), "config": v.config}
            for v in plan.values
        ],
    }
    write_atomic(path / SEARCH_FILE, yaml.safe_dump(doc, sort_keys=False, width=100))


def read_search(path: str | Path) -> SearchPlan:
    """The plan of a search directory (InputError when it is not one or is damaged)."""
    from cpkv.core.files.yaml_input import RECORD_LIMITS, read_yaml_file

    p = Path(path)
    if not is_search_dir(p):
        raise InputError(f"{path}: not a cpkv capacity search directory (no {SEARCH_FILE})")
    doc = read_yaml_file(p / SEARCH_FILE, InputError, RECORD_LIMITS, what="capacity search")
    version = doc.get("capacity_version") if isinstance(doc, dict) else None
    if version != CAPACITY_VERSION:
        raise InputError(
            f"{p / SEARCH_FILE}: capacity_version {version!r} is not supported (supported: "
            f"{CAPACITY_VERSION})"
        )
    try:
        values = tuple(
            AxisValue(
                str(v["label"]), v["value"], tuple(map(str, v["overrides"])), dict(v["config"])
            )
            for v in doc["values"]
        )
        return SearchPlan(
            name=str(doc["name"]),
            config_path=doc["config"],
            config_name=str(doc["config_name"]),
            overrides=tuple(map(str, doc["overrides"])),
            load_key=str(doc["load_key"]),
            axis_key=doc["axis_key"],
            values=values,
            spec=build(CapacitySpec, doc["settings"]),
            start=float(doc["start"]),
            slo=dict(doc["slo"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InputError(f"{p / SEARCH_FILE}: malformed capacity search ({err})") from None


@dataclass(frozen=True)
class PointOutcome:
    """What a search reads from one finished point."""

    load: float
    point: str
    status: str
    attainment_pct: float | None = None
    met: bool | None = None
    offered_requests_per_s: float | None = None
    goodput_requests_per_s: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    error: str | None = None


def read_outcome(run_dir: Path, load: float, target_pct: float) -> PointOutcome:
    """The attainment and the headline numbers of a finished point's run directory."""
    from cpkv.runs.rundir import load_run

    record = load_run(run_dir).record
    row = record.rows[0] if record.rows else {}
    attainment = row.get("slo_attainment_pct")
    if not isinstance(attainment, int | float):
        raise InputError(f"{run_dir}/results.json: no slo_attainment_pct (not a serving run)")
    return PointOutcome(
        load=load,
        point=run_dir.name,
        status="complete",
        attainment_pct=float(attainment),
        met=float(attainment) >= target_pct - 1e-9,
        offered_requests_per_s=offered_rate(run_dir / "requests.jsonl"),
        goodput_requests_per_s=row.get("goodput_requests_per_s"),
        ttft_p99_ms=row.get("ttft_p99_ms"),
        tpot_p99_ms=row.get("tpot_p99_ms"),
    )


def offered_rate(requests_jsonl: Path) -> float | None:
    """Requests per second the arrivals offer: (n - 1) / (last arrival - first arrival)."""
    try:
        text = requests_jsonl.read_text(encoding="utf-8")
    except OSError:
        return None
    times = []
    for line in text.splitlines():
        if line.strip():
            try:
                value = json.loads(line).get("arrival_ms")
            except (ValueError, AttributeError):
                return None
            if isinstance(value, int | float):
                times.append(float(value))
    if len(times) < 2:
        return None
    span_s = (max(times) - min(times)) / 1000.0
    return (len(times) - 1) / span_s if span_s > 0 else None


@dataclass(frozen=True)
class SearchResult:
    """One axis value's search: its points in the order tried and how it ended."""

    label: str
    value: Any
    outcome: str | None  # found, above_range, below_range, point_limit; failed; None: unfinished
    capacity_load: float | None
    bracket: tuple[float | None, float | None]
    points: tuple[PointOutcome, ...]
    error: str | None = None

    @property
    def at_capacity(self) -> PointOutcome | None:
        return next((p for p in self.points if p.load == self.capacity_load), None)


def result_doc(plan: SearchPlan, results: Sequence[SearchResult], status: str) -> dict[str, Any]:
    from cpkv.capacity.deployments import deployment_of, frontier

    doc = _result_doc(plan, results, status)
    if plan.spec.gpus:  # a search of deployments: each one's name and GPUs, the frontier
        for search, av in zip(doc["searches"], plan.values, strict=True):
            search["deployment"], search["gpus"] = deployment_of(av.config)
        doc["frontier"] = frontier(doc["searches"], plan.spec.target_load)
    return doc


def _result_doc(plan: SearchPlan, results: Sequence[SearchResult], status: str) -> dict[str, Any]:
    return {
        "capacity_version": CAPACITY_VERSION,
        "name": plan.name,
        "status": status,
        "config": plan.config_path,
        "load_key": plan.load_key,
        "axis_key": plan.axis_key,
        "target_attainment_pct": 100.0 * plan.spec.attainment,
        "tolerance": plan.spec.tolerance,
        "slo": plan.slo,
        "searches": [
            {
                "axis_value": r.value,
                "label": r.label,
                "outcome": r.outcome,
                "capacity_load": r.capacity_load,
                "capacity_offered_requests_per_s": _get(r.at_capacity, "offered_requests_per_s"),
                "capacity_goodput_requests_per_s": _get(r.at_capacity, "goodput_requests_per_s"),
                "bracket": list(r.bracket),
                "error": r.error,
                "points": [to_dict(p) for p in r.points],
            }
            for r in results
        ],
    }


def _get(outcome: PointOutcome | None, name: str) -> Any:
    return None if outcome is None else getattr(outcome, name)


def write_result(path: Path, plan: SearchPlan, results: Sequence[SearchResult], status: str) -> str:
    """Write capacity.json and capacity.txt; return the text."""
    doc = result_doc(plan, results, status)
    text = result_text(doc)
    write_atomic(path / RESULT_JSON, json.dumps(doc, indent=1) + "\n")
    write_atomic(path / RESULT_TXT, text)
    return text


def read_result(path: Path) -> dict[str, Any] | None:
    """capacity.json (:func:`load_result`), or None when it is missing or damaged."""
    try:
        return load_result(path)
    except InputError:
        return None


RESULT_NUMBERS = ("target_attainment_pct", "tolerance")
POINT_NUMBERS = ("load", "attainment_pct", "offered_requests_per_s", "goodput_requests_per_s")


def load_result(path: Path) -> dict[str, Any] | None:
    """capacity.json of the search directory ``path``, checked for the shape that
    :func:`result_doc` writes: None when there is none (not a search, or one that has not
    ended a point yet), InputError naming the file when it is damaged (truncated, not JSON,
    NaN or Infinity, another kind of document)."""
    from cpkv.runs.rundir import read_file_text

    file = Path(path) / RESULT_JSON
    if not file.exists():
        return None

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not a JSON number")

    try:
        doc = json.loads(read_file_text(file), parse_constant=refuse)
    except json.JSONDecodeError as err:
        raise InputError(f"{file}:{err.lineno}: not valid JSON ({err.msg})") from None
    except RecursionError:
        raise InputError(f"{file}: not a capacity result (nested too deeply)") from None
    except ValueError as err:
        raise InputError(f"{file}: not valid JSON ({err})") from None
    problem = _result_problem(doc)
    if problem is not None:
        raise InputError(f"{file}: malformed cpkv capacity result ({problem})")
    return doc


def _result_problem(doc: Any) -> str | None:
    """What keeps ``doc`` from being a capacity.json document, or None."""
    if not isinstance(doc, dict):
        return f"a JSON {type(doc).__name__}, not an object"
    if not isinstance(doc.get("searches"), list):
        return "'searches' is not a list"
    if not isinstance(doc.get("slo") or {}, dict):
        return "'slo' is not an object"
    for key in ("load_key", "axis_key"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            return f"{key!r} is not a string"
    numbers = [(key, doc.get(key)) for key in RESULT_NUMBERS]
    numbers += [(f"slo.{k}", v) for k, v in (doc.get("slo") or {}).items()]
    for i, search in enumerate(doc["searches"]):
        if not isinstance(search, dict) or not isinstance(search.get("points") or [], list):
            return f"searches[{i}] is not an object with a list of points"
        numbers.append((f"searches[{i}].capacity_load", search.get("capacity_load")))
        for j, point in enumerate(search.get("points") or []):
            if not isinstance(point, dict):
                return f"searches[{i}].points[{j}] is not an object"
            numbers += [(f"searches[{i}].points[{j}].{k}", point.get(k)) for k in POINT_NUMBERS]
    for where, value in numbers:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"{where} is {value!r}, not a number"
    return None


OUTCOME_TEXT = {
    "found": "found",
    "above_range": "above range (met at every load tried)",
    "below_range": "below range (missed at every load tried)",
    "point_limit": "point limit (bracket not within the tolerance)",
    "failed": "failed",
    None: "not finished",
}


def result_text(doc: Mapping[str, Any], fmt: str = "text") -> str:
    """The curve of each search (points in the order tried), then the table of capacities."""
    load = str(doc.get("load_key", "load")).split(".")[-1]
    axis_key = doc.get("axis_key")
    axis = axis_key.split(".")[-1] if axis_key else None
    target = doc.get("target_attainment_pct")
    parts = []
    for s in doc.get("searches") or []:
        title = f"{axis}={s.get('label')}: " if axis else ""
        rows = [
            {"step": k + 1, load: _num(p.get("load")), "offered_rps": p.get("offered_requests_per_s"),
             "attainment_pct": p.get("attainment_pct"), "meets": _meets(p),
             "goodput_rps": p.get("goodput_requests_per_s"), "ttft_p99_ms": p.get("ttft_p99_ms"),
             "tpot_p99_ms": p.get("tpot_p99_ms"), "point": str(p.get("point", "")).split("_")[0]}
            for k, p in enumerate(s.get("points") or [])
        ]  # fmt: skip
        columns = ["step", load, "offered_rps", "attainment_pct", "meets", "goodput_rps",
                   "ttft_p99_ms", "tpot_p99_ms", "point"]  # fmt: skip
        head = f"{'## ' if fmt == 'markdown' else ''}{title}points tried (target: {_pct(target)} of requests within the SLO)"
        parts.append(head + "\n" + table(rows, columns, fmt))
    rows = []
    for s in doc.get("searches") or []:
        low, high = (list(s.get("bracket") or []) + [None, None])[:2]
        row = {axis: s.get("label")} if axis else {}
        row.update({
            f"capacity_{load}": _num(s.get("capacity_load")),
            "offered_rps": s.get("capacity_offered_requests_per_s"),
            "goodput_rps": s.get("capacity_goodput_requests_per_s"),
            "bracket": f"[{_num(low)}, {_num(high)})",
            "points": len(s.get("points") or []),
            "outcome": OUTCOME_TEXT.get(s.get("outcome"), s.get("outcome")),
        })  # fmt: skip
        rows.append(row)
    columns = ([axis] if axis else []) + [f"capacity_{load}", "offered_rps", "goodput_rps",
                                          "bracket", "points", "outcome"]  # fmt: skip
    slo = ", ".join(f"{k} {v:g}" for k, v in (doc.get("slo") or {}).items() if v is not None)
    head = (
        f"{'## ' if fmt == 'markdown' else ''}capacity {doc.get('name')}: the highest "
        f"{doc.get('load_key')} at which >= {_pct(target)} of requests meet the SLO ({slo}), "
        f"to {100 * float(doc.get('tolerance') or 0):g}%"
    )
    parts.append(head + "\n" + table(rows, columns, fmt))
    if doc.get("frontier"):
        parts.append(_frontier_text(doc, load, fmt))
    errors = [f"{axis}={s.get('label')}: {s.get('error')}" if axis else str(s.get("error"))
              for s in doc.get("searches") or [] if s.get("error")]  # fmt: skip
    if errors:
        parts.append("\n".join(f"failed: {e}" for e in errors))
    return "\n\n".join(parts) + "\n"


def _frontier_text(doc: Mapping[str, Any], load: str, fmt: str) -> str:
    """The best deployment per GPU count, every deployment's capacity, the cheapest for the
    target load."""
    f = doc["frontier"]
    rows = [{"gpus": s.get("gpus"), "deployment": s.get("deployment"),
             f"capacity_{load}": _num(s.get("capacity_load")),
             "offered_rps": s.get("capacity_offered_requests_per_s"),
             "goodput_rps": s.get("capacity_goodput_requests_per_s")}
            for s in sorted(doc.get("searches") or [], key=lambda s: (s.get("gpus") or 0,
                                                                      s.get("deployment") or ""))]  # fmt: skip
    best = {(x["gpus"], x["deployment"]) for x in f.get("best_per_gpus") or []}
    for row in rows:
        row["best"] = "*" if (row["gpus"], row["deployment"]) in best else ""
    columns = ["gpus", "deployment", f"capacity_{load}", "offered_rps", "goodput_rps", "best"]
    head = f"{'## ' if fmt == 'markdown' else ''}deployments by GPUs (*: the highest capacity for its GPUs)"
    text = head + "\n" + table(rows, columns, fmt)
    target = f.get("target_load")
    if target is not None:
        cheap = f.get("cheapest")
        text += (
            f"\ncheapest deployment for {load} {target:g}: "
            + ("none reaches it" if cheap is None else
               f"{cheap['deployment']} ({cheap['gpus']} GPUs, capacity {_num(cheap['capacity_load'])})")
        )  # fmt: skip
    return text


def _meets(point: Mapping[str, Any]) -> str:
    met = point.get("met")
    if met is None:
        return point.get("status") or "-"
    return "yes" if met else "no"


def _pct(value: Any) -> str:
    return f"{value:g}%" if isinstance(value, int | float) else "?"


def _num(value: Any) -> str:
    """A load as typed: 0.70711, 2, 1e+03 (never rounded to 2 decimals)."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "-"
    return f"{value:g}"
